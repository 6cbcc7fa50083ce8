"""Subword regularization: K sampled segmentations of the training set, one per epoch in training.

A small corpus seen for many epochs is seen with one segmentation of each word; sampling a
different segmentation each epoch (Kudo 2018, "Subword Regularization"; Provilkov et al. 2020,
"BPE-Dropout") makes the model robust to how words are cut and is reported at +1 to +3 BLEU on
IWSLT-sized data. `nmt preprocess --subword-samples K --subword-alpha A` stores K such
segmentations of the kept training pairs' source side as extra splits `train.sample1` ..
`train.sampleK`, whose target side is the deterministic segmentation, the one the decoder
learns to write (sampling it too lost on Multi30k every time: docs/recipes.md);
`nmt train` trains epoch e on sample ((e - 1) mod K) + 1 (`sample_for_epoch`). Validation,
test and translation always use the deterministic segmentation (`train`, `valid`, ...).

What alpha means depends on the vocabulary:
  - bpe: BPE-dropout. A word starts as characters; at each step every applicable merge is
    dropped with probability alpha, and the best remaining one (SentencePiece's order: the
    highest score, leftmost first) is applied; the word is done when none remains. With
    alpha 0 this is SentencePiece's own BPE encoding (a test checks it). Provilkov et al.: 0.1.
  - unigram: a segmentation drawn from the unigram LM's lattice of the word with probability
    proportional to P(segmentation)^alpha (Kudo 2018, all segmentations, SentencePiece's
    `nbest_size=-1`); alpha 1 samples from the model, smaller is flatter. SentencePiece: 0.1.
  - wordpiece: none (greedy longest match has nothing to sample); refused.

SentencePiece has both samplers built in, but its generator (absl::BitGen) is salted per
process, so its samples cannot be reproduced from a seed. These are written here, on the
words SentencePiece's deterministic encoding gives (its normalization and whitespace handling
unchanged), with Python's Mersenne Twister seeded for every chunk of lines from (--seed,
sample, side, first line of the chunk): the files are the same whatever the number of worker
processes and whichever worker took a chunk.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from typing import Sequence

import numpy as np

SAMPLE_SPLIT = "train.sample{k}"
"""The split name of sample k (1-based): data/train.sample{k}.{lang}.bin/.idx."""

METHODS = {
    "bpe": "BPE-dropout (Provilkov et al. 2020): each applicable merge dropped with probability alpha",
    "unigram": "unigram LM sampling (Kudo 2018): segmentations drawn with probability P^alpha",
}
"""What sampling means for each vocabulary type that has it (`nmt preprocess --vocab-type`)."""

WORD_START = "\u2581"
"""SentencePiece's whitespace mark, which begins each word's first piece."""


def sample_split(k: int) -> str:
    return SAMPLE_SPLIT.format(k=k)


def sample_for_epoch(epoch: int, samples: int) -> int:
    """The sample (1..samples) that epoch `epoch` (1-based) trains on; 0 means the deterministic
    segmentation (no samples stored, or sampling turned off). A pure function of the epoch, so a
    resumed run picks the same one."""
    return (epoch - 1) % samples + 1 if samples > 0 else 0


def chunk_seed(seed: int, sample: int, side: int, first_line: int) -> int:
    """The generator seed of one chunk: independent streams for every (seed, sample, side, chunk)."""
    return int(np.random.SeedSequence([seed, sample, side, first_line]).generate_state(1)[0])


def sentencepiece_kind(sp: object) -> str:
    """"bpe" or "unigram": what a SentencePiece model is, from its scores. BPE numbers its pieces
    by merge order (score -rank, whole numbers); a unigram model scores them by log-probability.
    (The model file says so too, but reading it takes protobuf, which nmt does not depend on.)"""
    scores = [sp.get_score(i) for i in range(sp.get_piece_size()) if sp.is_control(i) is False and not sp.is_unknown(i)]
    return "bpe" if all(float(x).is_integer() for x in scores) else "unigram"


class SegmentationSampler:
    """Samples segmentations of lines with one SentencePiece model (BPE or unigram)."""

    def __init__(self, model_path: str, alpha: float):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.bpe = sentencepiece_kind(self.sp) == "bpe"
        self.alpha = alpha
        self.unk = self.sp.unk_id()
        n = self.sp.get_piece_size()
        normal = [i for i in range(n) if not (self.sp.is_control(i) or self.sp.is_unknown(i) or self.sp.is_unused(i))]
        self.ids = {self.sp.id_to_piece(i): i for i in normal}
        self.scores = {self.sp.id_to_piece(i): self.sp.get_score(i) for i in normal}
        self.max_len = max(map(len, self.ids))
        # SentencePiece scores an unknown character below every piece (unigram_model.cc: min - 10)
        self.unk_score = min(self.scores.values()) - 10.0
        self._lattice = lru_cache(maxsize=1 << 16)(self._forward)

    def encode(self, lines: Sequence[str], seed: int) -> list[list[int]]:
        """One sampled segmentation of each line, as ids; the same lines and seed give the same ids."""
        rng = random.Random(seed)
        sample = self._dropout if self.bpe else self._unigram
        ids, unk = self.ids, self.unk
        out = []
        for pieces in self.sp.encode(list(lines), out_type=str, num_threads=1):
            line: list[int] = []
            for word in _words(pieces):
                line.extend(ids.get(p, unk) for p in sample(word, rng))
            out.append(line)
        return out

    # -- BPE-dropout --------------------------------------------------------------------
    def _dropout(self, word: str, rng: random.Random) -> list[str]:
        symbols = list(word)
        scores, alpha = self.scores, self.alpha
        while len(symbols) > 1:
            best, where = -math.inf, -1
            for i in range(len(symbols) - 1):
                score = scores.get(symbols[i] + symbols[i + 1])
                if score is not None and score > best and rng.random() >= alpha:
                    best, where = score, i
            if where < 0:
                break
            symbols[where : where + 2] = [symbols[where] + symbols[where + 1]]
        return symbols

    # -- unigram sampling ---------------------------------------------------------------
    def _forward(self, word: str) -> list[tuple[list[int], list[float]]]:
        """For each end position t of `word`: the starts s of pieces word[s:t] and the cumulative
        weights exp(alpha * score + F[s]) - F[t] to draw one from (forward filtering)."""
        n, alpha, scores = len(word), self.alpha, self.scores
        forward = [0.0] + [-math.inf] * n  # log-sum of alpha * score over segmentations of word[:t]
        table: list[tuple[list[int], list[float]]] = [([], [])]
        for t in range(1, n + 1):
            starts, logits = [], []
            for s in range(max(0, t - self.max_len), t):
                score = scores.get(word[s:t])
                if score is None and t - s == 1:
                    score = self.unk_score  # an uncovered character is an unknown piece of its own
                if score is not None and forward[s] > -math.inf:
                    starts.append(s)
                    logits.append(alpha * score + forward[s])
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            forward[t] = top + math.log(sum(weights))
            total, cumulative = 0.0, []
            for w in weights:
                total += w
                cumulative.append(total)
            table.append((starts, cumulative))
        return table

    def _unigram(self, word: str, rng: random.Random) -> list[str]:
        table = self._lattice(word)
        pieces, t = [], len(word)
        while t > 0:  # backward sampling: the last piece, then what precedes it
            starts, cumulative = table[t]
            x = rng.random() * cumulative[-1]
            s = starts[next(i for i, c in enumerate(cumulative) if c > x)]
            pieces.append(word[s:t])
            t = s
        return pieces[::-1]


def _words(pieces: Sequence[str]) -> list[str]:
    """The words of one encoded line: runs of pieces, each starting where a piece begins with "▁"."""
    words: list[str] = []
    for piece in pieces:
        if piece.startswith(WORD_START) or not words:
            words.append(piece)
        else:
            words[-1] += piece
    return words
