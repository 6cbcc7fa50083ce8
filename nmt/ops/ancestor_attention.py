"""Decoder self-attention over a key/value cache that beam search never reorders, in C++.

A beam search step keeps each sentence's best hypotheses, and every kept row continues some
row of the step before (its parent). The stock cache (`nmt.model.incremental.SelfAttentionCache`)
follows that by gathering every layer's keys and values into the new row order, each step: on
a `mini` model that copy and the attention after it were the largest cost of a step that
PyTorch cannot fuse (#30). Here a layer's keys and values are written once, at the row and
step that computed them, and each row keeps a table of ancestors: the row of every earlier step
that it descends from. A step gathers that table (4 bytes per row and step, not 2 x d_model
floats) and the attention reads the keys through it:

    Attention(q, K, V) = softmax(q K_anc^T / sqrt(d_k)) V_anc,   K_anc[s] = K[s, anc[s]]   (3.2.1)

one query per row and head, computed in one pass over the row's keys and values by a C++
loop (nmt/ops/csrc/ancestor_attention.cpp; a second loop does the same for the encoder-decoder
attention of the step, each row against its sentence's source keys: `source_attention`), built
by `nmt.ops.native`, and used by the native decoder step (`nmt.ops.native_decoder_step`); where
it cannot be built, fp32 inference takes the stock step.

bench/results/2026-12-06_0f4956f_sapphire-rapids_ancestor-attention-prototype.json: several
times faster than the reorder and attention it replaces. tests/test_ancestor_attention.py checks the loop against
`F.scaled_dot_product_attention` over the gathered keys, and the decoder step against the
stock one.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from nmt.model.incremental import DecoderState, grown_capacity
from nmt.ops.native import loaded


def ancestor_attention(q: Tensor, steps: list[Tensor], anc: Tensor, length: int) -> Tensor:
    """Attention of q (rows, h, d_head; rows may be strided) over the first `length` steps,
    steps[s] (rows of step s, 2, h, d_head) the keys and values step s computed, row r reading
    step s at row anc[r, s] (anc: int32, (rows, capacity)); (rows, h, d_head)."""
    return loaded().ancestor_attention(q, steps, anc, length)


_NO_MASK = torch.empty(0, dtype=torch.bool)


SOURCE_LANES = 16
"""Source positions the C++ loop scores at once: the transposed keys' length is padded to a multiple."""


def transposed_source_keys(k: Tensor) -> Tensor:
    """The encoder-decoder keys k (N, h, S, d_head) as `source_attention` reads them: (N, h,
    d_head, S padded to a multiple of SOURCE_LANES), the padding zeros. Made once per batch."""
    n, heads, length, d_head = k.shape
    k_t = k.new_zeros(n, heads, d_head, -(-length // SOURCE_LANES) * SOURCE_LANES)
    k_t[..., :length] = k.transpose(2, 3)
    return k_t


def source_attention(q: Tensor, k_t: Tensor, v: Tensor, mask: Optional[Tensor], sentences: Tensor) -> Tensor:
    """The encoder-decoder attention of a step in one pass (3.2.3): q (rows, h, d_head; rows
    may be strided), a sentence's rows adjacent, live sentence i against entry sentences[i]
    (int64) of the source keys, transposed (`transposed_source_keys`), and values v (N, h, S,
    d_head); `mask` (N, 1, 1, S) True where attention is allowed, or None; (rows, h, d_head).
    `nmt.ops.product_attention.attention_by_products` computes the same in PyTorch."""
    flat = _NO_MASK if mask is None else mask.reshape(mask.size(0), mask.size(-1)).contiguous()
    return loaded().source_attention(q, k_t, v, flat, sentences)


class AncestorDecoderState(DecoderState):
    """The decoder state of the C++ step: its self-attention caches are `AncestorSelfAttentionCache`s,
    its encoder-decoder keys are held transposed (`transposed_source_keys`), and sentences that
    leave the search stay in the keys, values and mask until fewer than half of those held are
    live (then one gather), rather than a gather of all of them whenever one leaves: the search
    drops sentences at most steps, and those gathers showed in a decoder's profile. `sentences`
    (int64) maps each live sentence to its entry."""

    sentences: Tensor

    @classmethod
    def adopt(cls, state: DecoderState) -> "AncestorDecoderState":
        """`state` (fresh, with `AncestorSelfAttentionCache`s) as one of these, in place."""
        state.__class__ = cls
        state.memory_kv = [(transposed_source_keys(k), v) for k, v in state.memory_kv]
        state.sentences = torch.arange(state.memory_kv[0][1].size(0)) if state.memory_kv else torch.zeros(0, dtype=torch.long)
        return state

    def reorder(self, rows: Tensor, sentences: Optional[Tensor] = None) -> None:
        if sentences is not None:
            self.sentences = self.sentences[sentences]
            if self.memory_kv and 2 * self.sentences.numel() < self.memory_kv[0][1].size(0):
                live = self.sentences
                self.memory_kv = [(k.index_select(0, live), v.index_select(0, live)) for k, v in self.memory_kv]
                if self.memory_mask is not None:
                    self.memory_mask = self.memory_mask.index_select(0, live)
                self.sentences = torch.arange(live.numel())
        super().reorder(rows)  # the caches


class AncestorSelfAttentionCache:
    """One layer's keys and values by step and the row that computed them, `steps[s]` (rows of
    step s, 2, h, d_head), and each live row's ancestors, `anc` (rows, capacity) int32.

    A step's keys and values are written once, into a tensor of their own: the cache never
    grows by copying what it holds (a buffer over all steps did, by half at a time: 0.14 s of
    a 5.3 s decode of `mini`). `reorder` gathers the ancestor table only. Rows of finished
    hypotheses stay until the live rows are fewer than half of the most any step holds; the
    cache is then compacted (every step's live rows gathered once, the table reset), so it
    holds at most about twice what a reordered cache holds.
    """

    def __init__(self) -> None:
        self.steps: list[Tensor] = []
        self.anc: Optional[Tensor] = None
        self.rows = 0
        self.held = 0
        """The most rows a step holds."""

    @property
    def length(self) -> int:
        return len(self.steps)

    def attend(self, q: Tensor, kv: Tensor) -> Tensor:
        """Add this step's keys and values kv (rows, 2, h, d_head) and return the attention of
        q (rows, h, d_head) over all steps so far, (rows, h, d_head)."""
        n, t = kv.size(0), self.length
        if self.anc is None:
            self.anc = torch.empty(n, grown_capacity(0), dtype=torch.int32)
        elif t == self.anc.size(1) or n > self.anc.size(0):  # full, or more rows (the first step's fan-out)
            anc = torch.empty(max(n, self.anc.size(0)), grown_capacity(t) if t == self.anc.size(1) else self.anc.size(1),
                              dtype=torch.int32)
            anc[: self.anc.size(0), :t] = self.anc[:, :t]
            self.anc = anc
        self.steps.append(kv.contiguous())
        self.anc[:n, t] = torch.arange(n, dtype=torch.int32)
        self.rows, self.held = n, max(self.held, n)
        return ancestor_attention(q, self.steps, self.anc[:n], t + 1)

    def reorder(self, rows: Tensor, spare: Optional[Tensor]) -> Optional[Tensor]:
        """Row i continues row rows[i]: its ancestors become that row's. The spare buffer of
        `SelfAttentionCache` is not used and is passed on."""
        if self.anc is None:
            return spare
        n, live = rows.numel(), slice(0, self.length)
        anc = torch.empty(max(n, self.anc.size(0)), self.anc.size(1), dtype=torch.int32)
        torch.index_select(self.anc[: self.rows, live], 0, rows, out=anc[:n, live])
        self.anc, self.rows = anc, n
        if 2 * n < self.held:
            self._compact()
        return spare

    def _compact(self) -> None:
        """Keep only the live rows' keys and values: steps[s][i] = steps[s][anc[i, s]], anc[i, s] = i."""
        n = self.rows
        self.steps = [kv.index_select(0, self.anc[:n, s]) for s, kv in enumerate(self.steps)]
        self.anc = torch.arange(n, dtype=torch.int32)[:, None].expand(n, self.anc.size(1)).contiguous()
        self.held = n
