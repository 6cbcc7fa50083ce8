"""Batches by token count, from length-sorted buckets, shuffled per epoch (Section 5.1).

"Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens." A batch here holds at most `max_tokens` tokens on each side, padding
included (fairseq's --max-tokens). Batches are formed once per epoch from a seeded order, so
an epoch's batches are a pure function of (seed, epoch): resuming mid-epoch replays the same
list and skips what was done.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.data.token_arrays import TokenArray
from nmt.ops.bucketed_linear import padded_length
from nmt.model.config import NMT_SPECIAL_IDS, SpecialIds


@dataclass
class Batch:
    """Tensors of one batch: src (B, S), prev (B, T) bos-prefixed, target (B, T) eos-ended."""

    src: Tensor
    prev: Tensor
    target: Tensor
    n_src_tokens: int
    n_tgt_tokens: int

    @property
    def n_sentences(self) -> int:
        return int(self.src.size(0))

    def pin_memory(self) -> "Batch":
        """Page-locked copies, so that `to(cuda)` copies asynchronously."""
        return Batch(self.src.pin_memory(), self.prev.pin_memory(), self.target.pin_memory(), self.n_src_tokens, self.n_tgt_tokens)

    def to(self, device: torch.device) -> "Batch":
        nb = device.type == "cuda"
        return Batch(self.src.to(device, non_blocking=nb), self.prev.to(device, non_blocking=nb),
                     self.target.to(device, non_blocking=nb), self.n_src_tokens, self.n_tgt_tokens)


def usable_indices(src_sizes: np.ndarray, tgt_sizes: np.ndarray, max_positions: int) -> tuple[np.ndarray, int]:
    """Indices of pairs that fit the model's positions (eos/bos added), and how many were skipped."""
    ok = (src_sizes + 1 <= max_positions) & (tgt_sizes + 1 <= max_positions)
    return np.flatnonzero(ok), int((~ok).sum())


def make_batches(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    indices: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    max_sentences: int | None = None,
    len_multiple: int = 1,
    batch_multiple: int = 1,
) -> list[np.ndarray]:
    """Group `indices` into batches of similar length, in a random order fixed by (seed, epoch).

    Pairs are sorted by (target length, source length) with random tie-breaking, cut greedily
    so that (sentences x longest side + 1, rounded up to `len_multiple`) stays within
    `max_tokens` on both sides, and the batch order is shuffled. A pair too long for
    `max_tokens` on its own is a batch of one.

    `batch_multiple` (fairseq's --required-batch-size-multiple) trims a batch of at least that
    many sentences to a multiple of it; the rest starts the next batch. With `len_multiple`
    (collate pads to it too) an epoch has a few dozen tensor shapes instead of hundreds, which
    is what lets oneDNN's bf16 kernels, compiled once per shape, be reused (see `collate`).
    """
    rng = np.random.default_rng([seed, epoch])
    idx = indices[rng.permutation(len(indices))]
    if len(idx) == 0:
        return []
    # One stable sort on a combined key equals np.lexsort((src, tgt)): ties stay in random order.
    src_len = padded_length(src_sizes[idx].astype(np.int64) + 1, len_multiple)
    tgt_len = padded_length(tgt_sizes[idx].astype(np.int64) + 1, len_multiple)
    by_length = np.argsort(tgt_len * (int(src_len.max()) + 1) + src_len, kind="stable")
    idx, src_len, tgt_len = idx[by_length], src_len[by_length], tgt_len[by_length]
    ends = _greedy_batch_ends(src_len, tgt_len, max_tokens, max_sentences, batch_multiple)
    batches = np.split(idx, ends[:-1])
    return [batches[j] for j in rng.permutation(len(batches))]


def _greedy_batch_ends(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int, max_sentences: int | None,
                       batch_multiple: int = 1) -> list[int]:
    """End positions of the greedy cut over length-sorted pairs (lengths with eos/bos).

    A batch starting at `start` takes pairs while count x running max length fits on both
    sides. Target lengths never decrease, so a batch holds at most max_tokens // tgt_len[start]
    pairs: each cut is found with numpy over that window alone, which keeps a 4.5M-pair
    epoch to about a second instead of a Python step per pair.
    """
    n = len(src_len)
    cap = max(max_sentences if max_sentences is not None else n, 1)
    ends: list[int] = []
    start = 0
    while start < n:
        # Adding pair start + k makes k + 1 pairs; by k = `sure` the cut is certain.
        sure = max(min(max_tokens // max(int(src_len[start]), int(tgt_len[start])), cap), 1)
        last = min(sure, n - 1 - start)
        end = n
        if last > 0:
            count = np.arange(2, last + 2)
            src_max = np.maximum.accumulate(src_len[start : start + last + 1])[1:]
            over = (count * src_max > max_tokens) | (count * tgt_len[start + 1 : start + last + 1] > max_tokens) | (count > cap)
            if over.any():
                end = start + 1 + int(np.argmax(over))
        if end - start >= batch_multiple > 1:
            end = start + (end - start) // batch_multiple * batch_multiple
        ends.append(end)
        start = end
    return ends


def collate(src: TokenArray, tgt: TokenArray, ids: np.ndarray, len_multiple: int = 1,
            specials: SpecialIds = NMT_SPECIAL_IDS) -> Batch:
    """Pad one batch: sources get eos, decoder inputs bos + target, outputs target + eos
    (`specials`: the vocabulary's ids of pad, bos and eos).

    Widths are rounded up to `len_multiple`. Padding is masked and never counted, so it
    changes no result; it bounds the number of distinct shapes, and with it the kernels that
    oneDNN compiles (and caches, in memory that grows with each new shape) for bf16 matmuls.
    """
    ids = np.asarray(ids, dtype=np.int64)
    src_ids, src_lens = padded_sources(src, ids, multiple=len_multiple, specials=specials)  # (B, S): sentence, eos
    tgt_ids, tgt_lens = _padded(tgt, ids, extra=1, multiple=len_multiple, pad=specials.pad)  # (B, T)
    rows = np.arange(len(ids))
    prev = np.empty_like(tgt_ids)  # bos + target, shifted right
    prev[:, 0] = specials.bos
    prev[:, 1:] = tgt_ids[:, :-1]
    tgt_ids[rows, tgt_lens] = specials.eos
    return Batch(torch.from_numpy(src_ids), torch.from_numpy(prev), torch.from_numpy(tgt_ids),
                 int(src_lens.sum()) + len(ids), int(tgt_lens.sum()) + len(ids))


class Sentences(NamedTuple):
    """Sentences held in memory, laid out as a `TokenArray` is: sentence i is tokens[offsets[i]:offsets[i + 1]]."""

    tokens: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, seqs: Sequence[Sequence[int]]) -> "Sentences":
        lens = np.array([len(seq) for seq in seqs], dtype=np.int64)
        tokens = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
        return cls(tokens, np.concatenate(([0], np.cumsum(lens))))


def padded_sources(side: TokenArray | Sentences, ids: np.ndarray, multiple: int = 1,
                   specials: SpecialIds = NMT_SPECIAL_IDS) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's input (B, S): sentences `ids` of `side`, each followed by eos, right-padded
    with pad to the longest one's length + 1, rounded up to `multiple`; and the sentences'
    lengths without eos. Every source the model reads is laid out here: training and validation
    batches (`collate`), validation BLEU, and translation (`source_tensor`)."""
    out, lens = _padded(side, ids, extra=1, multiple=multiple, pad=specials.pad)
    out[np.arange(len(ids)), lens] = specials.eos
    return out, lens


def source_tensor(seqs: Sequence[Sequence[int]], specials: SpecialIds = NMT_SPECIAL_IDS) -> Tensor:
    """`padded_sources` of sentences given as lists of ids (a translation batch), as a long tensor."""
    return torch.from_numpy(padded_sources(Sentences.of(seqs), np.arange(len(seqs)), specials=specials)[0])


def _padded(side: TokenArray | Sentences, ids: np.ndarray, extra: int, multiple: int = 1,
            pad: int = NMT_SPECIAL_IDS.pad) -> tuple[np.ndarray, np.ndarray]:
    """Sentences `ids` of one side, left-aligned in an array of `pad` with `extra` spare columns,
    gathered in one vectorised read of the memory-mapped ids; and their lengths."""
    starts = np.asarray(side.offsets[ids], dtype=np.int64)
    lens = np.asarray(side.offsets[ids + 1], dtype=np.int64) - starts
    width = int(padded_length(np.int64(lens.max(initial=0) + extra), multiple))
    out = np.full((len(ids), width), pad, dtype=np.int64)
    total = int(lens.sum())
    if total:
        row = np.repeat(np.arange(len(ids)), lens)
        col = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
        out[row, col] = side.tokens[starts[row] + col]
    return out, lens
