"""The incremental decoder step of fp32 CPU inference in fewer operations: the same maths as
`Transformer.decode_step_hidden` (stock modules, one `SelfAttentionCache` per layer).

A beam search step on a CPU is hundreds of small PyTorch operations, and at the batch sizes
of translation each costs more in Python and operator set-up than in arithmetic (#30's
profile: about 1,300 operations per step of `mini`, per-operation cost the largest part of its
gap to CTranslate2). This step computes the same layers from their parameters with fewer:

- each layer's keys and values in one buffer, `PackedDecoderState.kv` (2, rows, h, capacity,
  d_head): a layer appends its step's keys and values with one write (its qkv projection
  already holds them side by side), and the beam search's reorder is one gather per layer
  instead of two;
- self-attention over the cache in place (no copy of the keys and values per step);
- the encoder-decoder attention as two batched products over each sentence's beam queries
  (`nmt.ops.attention.attention_by_products`' maths), the 1/sqrt(d_k) scale and the padding
  mask folded into the first product (`baddbmm` with an additive mask made once per batch);
- residual sums and ReLU in place; layer norms called as functions on the modules' parameters,
  projections through their `forward` (which keeps a device's choice of product,
  `nmt.ops.onednn_linear`), without `nn.Module.__call__`.

tests/test_cpu_decoder_step.py checks it against the stock step (logits at every step,
through reorders and sentences leaving the batch) and the searches' outputs against the stock
model's. `nmt.ops.attention.CpuTransformer` uses it for fp32 inference without autograd.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.model.transformer import ACTIVATIONS, EncoderOut, FeedForward, MultiHeadAttention, Residual, Transformer


class PackedDecoderState:
    """What the packed step carries between steps (the interface of
    `nmt.model.incremental.DecoderState`: `reorder`, `step`, `beam`).

    `kv`: per layer, one buffer (2, rows held, h, capacity, d_head) of its self-attention
    keys (index 0) and values (1); rows [:rows] and steps [:length] are live. A layer's keys
    are then one batch of (steps, d_head) matrices, one per row and head, that a batched
    product reads in place. The capacity grows by half when full (`SelfAttentionCache`'s
    rule), and `reorder` gathers each layer's live part into a spare buffer that then becomes
    its cache, handing the old one on as the next layer's spare: one read and one write of the
    cache per step, one buffer more than the cache (one buffer for all layers was one gather
    per step, but a spare as large as the whole cache: `nmt translate`'s peak RSS rose by
    240-330 MiB on Multi30k). When the cache is full, that gather is also the growth.

    `memory_kv`: per layer, the encoder-decoder keys and values (N, h, S, d_head), one entry
    per sentence, shared by its `beam` adjacent rows; `memory_bias` (N, h, 1, S): 0 where a
    source position may be attended, -inf at padding (None: no padding in the batch).
    """

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], memory_bias: Optional[Tensor], layers: int,
                 beam: int = 1):
        self.memory_kv = memory_kv
        self.memory_bias = memory_bias
        self.beam = beam
        self.kv: list[Optional[Tensor]] = [None] * layers
        self.spare: Optional[Tensor] = None
        self.rows = 0
        self.length = 0
        self.step = 0

    def append(self, layer: int, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Write `layer`'s keys and values of this step, kv (rows, 2, h, d_head), after the
        cached steps; return its keys and values of all steps, (rows, h, steps, d_head) each."""
        n, _, heads, d_head = kv.shape
        cache = self.kv[layer]
        if cache is None:
            cache = self.kv[layer] = kv.new_empty(2, n, heads, 8, d_head)
        elif self.length == cache.size(3):  # full, and no reorder grew it
            grown = kv.new_empty(2, n, heads, _grown(cache.size(3)), d_head)
            grown[:, :, :, : self.length] = cache[:, :n, :, : self.length]
            cache = self.kv[layer] = grown
        self.rows = n
        cache = cache[:, :n]
        cache[:, :, :, self.length] = kv.transpose(0, 1)
        live = cache[:, :, :, : self.length + 1]
        return live[0], live[1]

    def end_step(self) -> None:
        """Every layer has appended this step."""
        self.length += 1
        self.step += 1

    def reorder(self, rows: Tensor, sentences: Optional[Tensor] = None) -> None:
        """`DecoderState.reorder`: continue from `rows`; `sentences` keeps only those."""
        if sentences is not None:
            self.memory_kv = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.memory_kv]
            if self.memory_bias is not None:
                self.memory_bias = self.memory_bias.index_select(0, sentences)
        n, live, spare = rows.numel(), slice(0, self.length), self.spare
        for layer, cache in enumerate(self.kv):
            if cache is None:
                return
            capacity, held = cache.size(3), max(n, cache.size(1))
            if self.length == capacity:  # full: the gather into a larger buffer (of the rows alive) is the growth
                capacity, held = _grown(capacity), n
            if spare is None or spare.size(1) < n or spare.size(3) != capacity:
                spare = cache.new_empty(2, held, cache.size(2), capacity, cache.size(4))
            torch.index_select(cache[:, : self.rows, :, live], 1, rows, out=spare[:, :n, :, live])
            self.kv[layer], spare = spare, cache
        self.spare, self.rows = spare, n


def _grown(capacity: int) -> int:
    """The next capacity: half as large again (`SelfAttentionCache`'s rule)."""
    return (3 * capacity + 1) // 2


def init_packed_state(model: Transformer, enc: EncoderOut, beam: int = 1) -> PackedDecoderState:
    """`Transformer.init_decoder_state` for the packed step: the encoder-decoder keys and
    values of every layer once, and the padding mask as an additive bias per head."""
    memory_kv = [tuple(t.contiguous() for t in layer.cross_attn.project_kv(enc.states)) for layer in model.decoder_layers]
    bias = None
    if enc.attn_mask is not None:  # (N, 1, 1, S) True where allowed -> (N, h, 1, S) of 0 / -inf
        n_sent, heads, source = enc.states.size(0), model.cfg.n_heads, enc.states.size(1)
        bias = enc.states.new_zeros(n_sent, heads, 1, source).masked_fill_(~enc.attn_mask, float("-inf"))
    return PackedDecoderState(memory_kv, bias, len(model.decoder_layers), beam)


def packed_decode_step_hidden(model: Transformer, tokens: Tensor, state: PackedDecoderState) -> Tensor:
    """`Transformer.decode_step_hidden`: feed one token per row, return the decoder states
    (rows, d_model) and advance `state`."""
    cfg = model.cfg
    # Dropout(sqrt(d_model) * E[tokens] + PE[step]), dropout off (3.4, 3.5)
    x = F.embedding(tokens, model.tgt_embed.weight).mul_(model.embed_scale).add_(model.positions[state.step])
    for index, layer in enumerate(model.decoder_layers):
        x = _sublayer(layer.self_block, x, _self_attention, layer.self_attn, state, index)
        x = _sublayer(layer.cross_block, x, _cross_attention, layer.cross_attn, state, index)
        x = _sublayer(layer.ffn_block, x, _feed_forward, layer.ffn, cfg.activation)
    if model.decoder_norm is not None:
        x = _layer_norm(model.decoder_norm, x)
    state.end_step()
    return x


def _sublayer(block: Residual, x: Tensor, sublayer: Callable[..., Tensor], *args: Any) -> Tensor:
    """`Residual` without dropout around `sublayer(x, *args)`: LayerNorm(x + Sublayer(x))
    (post-LN, the paper), or x + Sublayer(LayerNorm(x)) (pre-LN). The sublayer's output is
    fresh, so the sum is in place."""
    if block.pre_ln:
        return sublayer(_layer_norm(block.norm, x), *args).add_(x)
    return _layer_norm(block.norm, sublayer(x, *args).add_(x))


def _layer_norm(norm: torch.nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _self_attention(x: Tensor, attn: MultiHeadAttention, state: PackedDecoderState, layer: int) -> Tensor:
    """Masked self-attention of one new position over the cached ones (3.2.3), x (rows, d_model).

    With one query per row and head, PyTorch's flash-attention kernel is the faster way over a
    few cached steps, two batched products (`_attend_by_products`) over more: PyTorch runs a
    product of fewer than 400 multiply-adds per matrix in a loop of its own, at or above
    that in MKL. Over 300 / 1,000 rows (d_head 32, one thread, Sapphire Rapids) the kernel
    took 0.47-0.67 / 1.5-2.2 ms at 6-12 steps where the loop took 0.70-1.02 / 2.1-3.4, and
    0.71 / 2.2 ms at 20 steps where MKL took 0.49 / 1.4."""
    n, d_model = x.shape
    heads, d_head = attn.n_heads, attn.d_head
    qkv = attn.qkv_proj.forward(x)  # (rows, 3 d_model): Q | K | V
    k, v = state.append(layer, qkv[:, d_model:].view(n, 2, heads, d_head))  # (rows, h, steps, d_head)
    q = qkv[:, :d_model].view(n, heads, 1, d_head)
    if k.size(2) * d_head < 400:
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        out = _attend_by_products(q, k, v)
    return attn.out_proj.forward(out.view(n, d_model))


def _attend_by_products(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q K^T / sqrt(d_k)) V for q (rows, h, 1, d_head) and the cache's k, v (rows, h,
    steps, d_head), read in place as one batch of (steps, d_head) matrices."""
    n, heads, steps, d_head = k.shape
    scores = torch.bmm(q.reshape(n * heads, 1, d_head), k.reshape(n * heads, steps, d_head).transpose(1, 2))
    out = torch.bmm(scores.mul_(d_head**-0.5).softmax(-1), v.reshape(n * heads, steps, d_head))
    return out.view(n, heads, 1, d_head)


def _cross_attention(x: Tensor, attn: MultiHeadAttention, state: PackedDecoderState, layer: int) -> Tensor:
    """Encoder-decoder attention (3.2.3): a sentence's `beam` rows query its source keys
    together, softmax(Q K^T / sqrt(d_k) + padding bias) V as two batched products."""
    n, d_model = x.shape
    heads, d_head = attn.n_heads, attn.d_head
    k, v = state.memory_kv[layer]  # (N, h, S, d_head)
    n_sent, source = k.size(0), k.size(2)
    beam = n // n_sent
    q = attn.q_proj.forward(x)
    q = q.view(n_sent, beam, heads, d_head).transpose(1, 2).reshape(n_sent * heads, beam, d_head)
    keys_t = k.view(n_sent * heads, source, d_head).transpose(1, 2)
    scale = d_head**-0.5
    if state.memory_bias is None:
        scores = torch.bmm(q, keys_t).mul_(scale)
    else:
        scores = torch.baddbmm(state.memory_bias.view(n_sent * heads, 1, source), q, keys_t, alpha=scale)
    out = torch.bmm(scores.softmax(-1), v.view(n_sent * heads, source, d_head))  # (N h, beam, d_head)
    out = out.view(n_sent, heads, beam, d_head).transpose(1, 2).reshape(n, d_model)
    return attn.out_proj.forward(out)


def _feed_forward(x: Tensor, ffn: FeedForward, activation: str) -> Tensor:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (3.3), or its swish / gelu variant."""
    hidden = ffn.fc1.forward(x)
    hidden = hidden.relu_() if activation == "relu" else ACTIVATIONS[activation](hidden)
    return ffn.fc2.forward(hidden)
