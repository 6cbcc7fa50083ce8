"""What step-by-step decoding carries between steps: the self-attention caches and the decoder state.

Beam search feeds the decoder one token per hypothesis at a time (Section 6.1); each layer's
self-attention then needs the keys and values of every token decoded so far, and the
encoder-decoder attention the keys and values of the source, computed once.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import torch
from torch import Tensor


def grown_capacity(capacity: int) -> int:
    """A full cache's next capacity: half as large again (8 steps for the first)."""
    return (3 * capacity + 1) // 2 if capacity else 8


class SelfAttentionCache:
    """Keys and values of the tokens decoded so far, (rows, h, capacity, d_head) each.

    Appending writes one step in place; the capacity grows by half when full, so a step never
    copies the whole cache just to grow it (as concatenation would), and the last growth
    overshoots the steps still to come by less than doubling did (a lower peak RSS of
    `nmt translate` on Multi30k).

    `reorder` gathers the surviving rows into a spare buffer of the same shape, which then
    becomes the cache, and hands the old buffer back as the next spare: one read and one
    write of the cache per step. (Gathering into a temporary and copying it back in place
    costs a second pass and a fresh temporary of the whole cache every step, several times
    the time of the gather alone.) The decoder state
    passes one spare along all its layers, so the search holds one buffer more than the cache.
    """

    def __init__(self) -> None:
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None
        """Whole buffers (rows held, h, capacity, d_head); rows [:rows] and steps [:length] are live."""
        self.rows = 0
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k, v (rows, h, T, d_head) after the cached steps; return views of all steps."""
        end = self.length + k.size(2)
        if self.k is None or end > self.k.size(2):
            self._grow(k, max(end, grown_capacity(self.k.size(2) if self.k is not None else 0)))
        n = k.size(0)
        self.k[:n, :, self.length : end] = k
        self.v[:n, :, self.length : end] = v
        self.rows, self.length = n, end
        return self.k[:n, :, :end], self.v[:n, :, :end]

    def _grow(self, like: Tensor, capacity: int) -> None:
        rows, heads, _, d_head = like.shape
        k, v = (like.new_empty(rows, heads, capacity, d_head) for _ in range(2))
        if self.k is not None:
            k[:, :, : self.length] = self.k[:rows, :, : self.length]
            v[:, :, : self.length] = self.v[:rows, :, : self.length]
        self.k, self.v = k, v

    def reorder(self, rows: Tensor, spare: Optional[Tensor]) -> Optional[Tensor]:
        """Keep `rows` (in that order, repeats allowed: the first beam step fans one row per
        sentence out to k) as rows 0..n-1, gathered into `spare` when it fits (else into a new
        buffer); returns the buffer freed, the next spare."""
        if self.k is None:
            return spare
        n, live = rows.numel(), slice(0, self.length)
        for name in ("k", "v"):
            buf = getattr(self, name)
            if spare is None or spare.shape[1:] != buf.shape[1:] or spare.size(0) < n or spare.dtype != buf.dtype:
                spare = buf.new_empty(max(n, buf.size(0)), *buf.shape[1:])
            torch.index_select(buf[: self.rows, :, live], 0, rows, out=spare[:n, :, live])
            setattr(self, name, spare)
            spare = buf
        self.rows = n
        return spare


class Cache(Protocol):
    """A layer's self-attention cache: `SelfAttentionCache`, or a device's own layout of it."""

    def reorder(self, rows: Tensor, spare: Optional[Tensor]) -> Optional[Tensor]: ...


class DecoderState:
    """What incremental decoding carries between steps: per-layer self-attention caches,
    the encoder-decoder keys/values and source mask (computed once, one entry per sentence,
    shared by the sentence's `beam` adjacent rows) and the step."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], memory_mask: Optional[Tensor], beam: int = 1,
                 cache: Callable[[], Cache] = SelfAttentionCache):
        self.memory_kv = memory_kv
        self.memory_mask = memory_mask
        self.beam = beam
        self.caches = [cache() for _ in memory_kv]
        self.spare: Optional[Tensor] = None
        """The buffer each cache's `reorder` gathers into, passed from cache to cache."""
        self.step = 0

    def reorder(self, rows: Tensor, sentences: Optional[Tensor] = None) -> None:
        """Continue from `rows` (beam search: the surviving hypotheses' parents), `beam` per
        sentence; `sentences` (indices, in order) keeps only those sentences, whose rows
        `rows` must then be."""
        if sentences is not None:
            self.memory_kv = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.memory_kv]
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, sentences)
        for cache in self.caches:
            self.spare = cache.reorder(rows, self.spare)
