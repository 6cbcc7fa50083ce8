"""What step-by-step decoding carries between steps: the self-attention caches and the decoder state.

Beam search feeds the decoder one token per hypothesis at a time (Section 6.1); each layer's
self-attention then needs the keys and values of every token decoded so far, and the
encoder-decoder attention the keys and values of the source, computed once.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor


class SelfAttentionCache:
    """Keys and values of the tokens decoded so far, (rows, h, capacity, d_head) each.

    Appending writes one step in place; the capacity grows by half when full, so a step never
    copies the whole cache just to grow it (as concatenation would), and the last growth
    overshoots the steps still to come by less than doubling did (measured on Multi30k: the
    peak RSS of `nmt translate` fell by 20 MiB). `reorder` moves the surviving rows within
    the same buffers.
    """

    def __init__(self) -> None:
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k, v (rows, h, T, d_head) after the cached steps; return views of all steps."""
        end = self.length + k.size(2)
        if self.k is None or end > self.k.size(2):
            self._grow(k, max(end, (3 * self.k.size(2) + 1) // 2 if self.k is not None else 8))
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def _grow(self, like: Tensor, capacity: int) -> None:
        rows, heads, _, d_head = like.shape
        k, v = (like.new_empty(rows, heads, capacity, d_head) for _ in range(2))
        if self.k is not None:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def reorder(self, rows: Tensor) -> None:
        """Keep `rows` (in that order) as rows 0..n-1, in place in the same buffers: a second
        buffer to gather into would double the cache, the largest memory of a CPU search."""
        if self.k is None:
            return
        n = rows.numel()
        for buf in (self.k, self.v):
            buf[:n, :, : self.length] = buf[:, :, : self.length].index_select(0, rows)
        self.k, self.v = self.k[:n], self.v[:n]


class DecoderState:
    """What incremental decoding carries between steps: per-layer self-attention caches,
    the encoder-decoder keys/values and source mask (computed once, one entry per sentence,
    shared by the sentence's `beam` adjacent rows) and the step."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], memory_mask: Optional[Tensor], beam: int = 1):
        self.memory_kv = memory_kv
        self.memory_mask = memory_mask
        self.beam = beam
        self.caches = [SelfAttentionCache() for _ in memory_kv]
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
            cache.reorder(rows)
