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

import numpy as np
import torch
from torch import Tensor

from nmt.data import TokenArray
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID


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
) -> list[np.ndarray]:
    """Group `indices` into batches of similar length, in a random order fixed by (seed, epoch).

    Pairs are sorted by (target length, source length) with random tie-breaking, cut greedily
    so that (sentences x longest side + 1) stays within `max_tokens` on both sides, and the
    batch order is shuffled.
    """
    rng = np.random.default_rng([seed, epoch])
    idx = indices[rng.permutation(len(indices))]
    idx = idx[np.lexsort((src_sizes[idx], tgt_sizes[idx]))]  # stable: random ties
    src_len = src_sizes[idx] + 1
    tgt_len = tgt_sizes[idx] + 1
    batches: list[np.ndarray] = []
    start, n = 0, len(idx)
    max_src = max_tgt = 0
    for i in range(n):
        s, t = src_len[i], tgt_len[i]
        new_src, new_tgt = max(max_src, s), max(max_tgt, t)
        count = i - start + 1
        too_big = count * new_src > max_tokens or count * new_tgt > max_tokens
        too_many = max_sentences is not None and count > max_sentences
        if (too_big or too_many) and count > 1:
            batches.append(idx[start:i])
            start, max_src, max_tgt = i, s, t
        else:
            max_src, max_tgt = new_src, new_tgt
    if start < n:
        batches.append(idx[start:])
    order = rng.permutation(len(batches))
    return [batches[j] for j in order]


def collate(src: TokenArray, tgt: TokenArray, ids: np.ndarray) -> Batch:
    """Pad one batch: sources get eos, decoder inputs bos + target, outputs target + eos."""
    src_seqs = [src[i] for i in ids]
    tgt_seqs = [tgt[i] for i in ids]
    B = len(ids)
    S = max(len(s) for s in src_seqs) + 1
    T = max(len(t) for t in tgt_seqs) + 1
    src_arr = np.full((B, S), PAD_ID, dtype=np.int64)
    prev_arr = np.full((B, T), PAD_ID, dtype=np.int64)
    tgt_arr = np.full((B, T), PAD_ID, dtype=np.int64)
    n_src = n_tgt = 0
    for b, (s, t) in enumerate(zip(src_seqs, tgt_seqs)):
        ls, lt = len(s), len(t)
        src_arr[b, :ls] = s
        src_arr[b, ls] = EOS_ID
        prev_arr[b, 0] = BOS_ID
        prev_arr[b, 1 : lt + 1] = t
        tgt_arr[b, :lt] = t
        tgt_arr[b, lt] = EOS_ID
        n_src += ls + 1
        n_tgt += lt + 1
    return Batch(torch.from_numpy(src_arr), torch.from_numpy(prev_arr), torch.from_numpy(tgt_arr), n_src, n_tgt)
