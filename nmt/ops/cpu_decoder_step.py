"""The incremental decoder step of fp32 CPU inference in fewer operations: the same maths as
`Transformer.decode_step_hidden` (stock modules, one `SelfAttentionCache` per layer).

A beam search step on a CPU is hundreds of small PyTorch operations, and at the batch sizes
of translation each costs more in Python and operator set-up than in arithmetic (#30's
profile: about 1,300 operations per step of `mini`, per-operation cost the largest part of its
gap to CTranslate2). This step computes the same layers from their parameters with fewer:

- each layer's keys and values in one buffer (`PackedSelfAttentionCache`): a layer appends its
  step's keys and values with one write (its qkv projection already holds them side by side),
  and the beam search's reorder is one gather per layer instead of two;
- self-attention over the cache in place (no copy of the keys and values per step);
- the encoder-decoder attention as two batched products over each sentence's beam queries
  (`nmt.ops.product_attention`);
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

from nmt.model.incremental import DecoderState, grown_capacity
from nmt.model.transformer import ACTIVATIONS, FeedForward, MultiHeadAttention, Residual, Transformer
from nmt.ops.add_and_norm import add_and_norm, bias_relu
from nmt.ops.ancestor_attention import AncestorDecoderState, AncestorSelfAttentionCache, source_attention
from nmt.ops.onednn_linear import OneDnnLinear
from nmt.ops.product_attention import attention_by_products


class PackedSelfAttentionCache:
    """One layer's self-attention keys and values in one buffer, `kv` (2, rows held, h,
    capacity, d_head): keys at index 0, values at 1; rows [:rows] and steps [:length] are live.
    The keys are then one batch of (steps, d_head) matrices, one per row and head, that a
    batched product reads in place.

    As `SelfAttentionCache`: the capacity grows by half when full, and `reorder` gathers the
    live part into the spare buffer the decoder state passes along its layers, which then
    becomes the cache, handing the old one on as the next spare (one read and one write of the
    cache per step, one buffer more than the cache). When the cache is full, that gather is
    also the growth, into a buffer of the rows still alive.
    """

    def __init__(self) -> None:
        self.kv: Optional[Tensor] = None
        self.rows = 0
        self.length = 0

    def append(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values, kv (rows, 2, h, d_head), after the cached steps;
        return the keys and values of all steps, (rows, h, steps, d_head) each."""
        n, _, heads, d_head = kv.shape
        if self.kv is None:
            self.kv = kv.new_empty(2, n, heads, grown_capacity(0), d_head)
        elif self.length == self.kv.size(3):  # full, and no reorder grew it
            grown = kv.new_empty(2, n, heads, grown_capacity(self.length), d_head)
            grown[:, :, :, : self.length] = self.kv[:, :n, :, : self.length]
            self.kv = grown
        cache = self.kv[:, :n]
        cache[:, :, :, self.length] = kv.transpose(0, 1)
        self.rows, self.length = n, self.length + 1
        live = cache[:, :, :, : self.length]
        return live[0], live[1]

    def reorder(self, rows: Tensor, spare: Optional[Tensor]) -> Optional[Tensor]:
        """`SelfAttentionCache.reorder`: keep `rows` as rows 0..n-1, gathered into `spare`
        where it fits; returns the buffer freed, the next spare."""
        if self.kv is None:
            return spare
        n, cache = rows.numel(), self.kv
        capacity, held = cache.size(3), max(n, cache.size(1))
        if self.length == capacity:
            capacity, held = grown_capacity(capacity), n
        if spare is None or spare.size(1) < n or spare.shape[2:] != (cache.size(2), capacity, cache.size(4)):
            spare = cache.new_empty(2, held, cache.size(2), capacity, cache.size(4))
        live = slice(0, self.length)
        torch.index_select(cache[:, : self.rows, :, live], 1, rows, out=spare[:, :n, :, live])
        self.kv, self.rows = spare, n
        return cache


def packed_decode_step_hidden(model: Transformer, tokens: Tensor, state: DecoderState) -> Tensor:
    """`Transformer.decode_step_hidden` for a state of `PackedSelfAttentionCache`s, or an
    `nmt.ops.ancestor_attention.AncestorDecoderState` (where the C++ kernels are built): feed one
    token per row, return the decoder states (rows, d_model) and advance `state`."""
    cfg = model.cfg
    # Dropout(sqrt(d_model) * E[tokens] + PE[step]), dropout off (3.4, 3.5)
    x = F.embedding(tokens, model.tgt_embed.weight).mul_(model.embed_scale).add_(model.positions[state.step])
    native = isinstance(state, AncestorDecoderState)  # the C++ kernels are built
    for layer, cache, memory_kv in zip(model.decoder_layers, state.caches, state.memory_kv):
        if native:  # each sublayer up to its last product, then "Add & Norm" in C++ (nmt.ops.add_and_norm)
            x = _add_and_norm(layer.self_block, x, layer.self_attn.out_proj, _self_attention_heads, layer.self_attn, cache)
            x = _add_and_norm(layer.cross_block, x, layer.cross_attn.out_proj, _cross_attention_heads, layer.cross_attn,
                              memory_kv, state.memory_mask, state.sentences)
            x = _add_and_norm(layer.ffn_block, x, layer.ffn.fc2, _feed_forward_hidden, layer.ffn, cfg.activation)
            continue
        x = _sublayer(layer.self_block, x, _self_attention, layer.self_attn, cache)
        x = _sublayer(layer.cross_block, x, _cross_attention, layer.cross_attn, memory_kv, state.memory_mask)
        x = _sublayer(layer.ffn_block, x, _feed_forward, layer.ffn, cfg.activation)
    if model.decoder_norm is not None:
        x = _layer_norm(model.decoder_norm, x)
    state.step += 1
    return x


def _sublayer(block: Residual, x: Tensor, sublayer: Callable[..., Tensor], *args: Any) -> Tensor:
    """`Residual` without dropout around `sublayer(x, *args)`: LayerNorm(x + Sublayer(x))
    (post-LN, the paper), or x + Sublayer(LayerNorm(x)) (pre-LN). The sublayer's output is
    fresh, so the sum is in place."""
    if block.pre_ln:
        return sublayer(_layer_norm(block.norm, x), *args).add_(x)
    return _layer_norm(block.norm, sublayer(x, *args).add_(x))


def _add_and_norm(block: Residual, x: Tensor, last: torch.nn.Linear, inner: Callable[..., Tensor], *args: Any) -> Tensor:
    """`_sublayer` whose sublayer is `inner(x, *args)` followed by the linear layer `last`: the
    product without its bias, then the bias, the residual sum and (post-LN) the layer norm in
    one pass. (A device's own product, `OneDnnLinear`, adds its bias itself.)"""
    y, bias = _product_before_bias(last, inner(_layer_norm(block.norm, x) if block.pre_ln else x, *args))
    return add_and_norm(y, bias, x, None if block.pre_ln else block.norm)


def _product_before_bias(linear: torch.nn.Linear, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
    """x W^T and the bias still to add to it (None: none, or a device's own product,
    `OneDnnLinear`, added it already)."""
    if type(linear) is OneDnnLinear:
        return linear.forward(x), None
    return torch.mm(x, linear.weight.t()), linear.bias


def _layer_norm(norm: torch.nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _self_attention(x: Tensor, attn: MultiHeadAttention, cache: PackedSelfAttentionCache) -> Tensor:
    """Masked self-attention of one new position over the cached ones (3.2.3), x (rows, d_model).

    With one query per row and head, PyTorch's flash-attention kernel is the faster way over a
    few cached steps, two batched products over more: PyTorch runs a product of fewer than 400
    multiply-adds per matrix in a loop of its own, at or above that in MKL. Over 300 / 1,000
    rows (d_head 32, one thread, Sapphire Rapids) the kernel took 0.47-0.67 / 1.5-2.2 ms at 6-12
    steps where the loop took 0.70-1.02 / 2.1-3.4, and 0.71 / 2.2 ms at 20 steps where MKL took
    0.49 / 1.4."""
    n, d_model = x.shape
    heads, d_head = attn.n_heads, attn.d_head
    qkv = attn.qkv_proj.forward(x)  # (rows, 3 d_model): Q | K | V
    k, v = cache.append(qkv[:, d_model:].view(n, 2, heads, d_head))  # (rows, h, steps, d_head)
    q = qkv[:, :d_model].view(n, heads, 1, d_head)
    if k.size(2) * d_head < 400:
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        out = attention_by_products(q, k, v)
    return attn.out_proj.forward(out.view(n, d_model))


def _self_attention_heads(x: Tensor, attn: MultiHeadAttention, cache: AncestorSelfAttentionCache) -> Tensor:
    """`_self_attention` before its output projection, by the C++ loop over the unreordered
    cache: Concat(head_1, ..., head_h), (rows, d_model)."""
    n, d_model = x.shape
    heads, d_head = attn.n_heads, attn.d_head
    qkv = attn.qkv_proj.forward(x)  # (rows, 3 d_model): Q | K | V
    out = cache.attend(qkv[:, :d_model].view(n, heads, d_head), qkv[:, d_model:].view(n, 2, heads, d_head))
    return out.view(n, d_model)


def _cross_attention_heads(x: Tensor, attn: MultiHeadAttention, memory_kv: tuple[Tensor, Tensor],
                           memory_mask: Optional[Tensor], sentences: Tensor) -> Tensor:
    """`_cross_attention` before its output projection, in one pass by the C++ loop
    (`nmt.ops.ancestor_attention.source_attention`; live sentence i reads entry sentences[i] of
    the keys and values): Concat(head_1, ..., head_h), (rows, d_model)."""
    n, d_model = x.shape
    k_t, v = memory_kv
    q = attn.q_proj.forward(x).view(n, attn.n_heads, attn.d_head)
    return source_attention(q, k_t, v, memory_mask, sentences).view(n, d_model)


def _cross_attention(x: Tensor, attn: MultiHeadAttention, memory_kv: tuple[Tensor, Tensor],
                     memory_mask: Optional[Tensor]) -> Tensor:
    """Encoder-decoder attention (3.2.3): a sentence's `beam` rows query its source keys
    (N, h, S, d_head) together, as the stock `MultiHeadAttention` does."""
    n, d_model = x.shape
    k, v = memory_kv
    n_sent = k.size(0)
    q = attn.q_proj.forward(x).view(n_sent, n // n_sent, attn.n_heads, attn.d_head).transpose(1, 2)  # (N, h, beam, d_head)
    out = attention_by_products(q, k, v, memory_mask)
    return attn.out_proj.forward(out.transpose(1, 2).reshape(n, d_model))


def _feed_forward(x: Tensor, ffn: FeedForward, activation: str) -> Tensor:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (3.3), or its swish / gelu variant."""
    hidden = ffn.fc1.forward(x)
    hidden = hidden.relu_() if activation == "relu" else ACTIVATIONS[activation](hidden)
    return ffn.fc2.forward(hidden)


def _feed_forward_hidden(x: Tensor, ffn: FeedForward, activation: str) -> Tensor:
    """max(0, x W1 + b1) of `_feed_forward`, the ReLU and bias in one pass (`nmt.ops.add_and_norm.bias_relu`)."""
    if activation == "relu":
        hidden, bias = _product_before_bias(ffn.fc1, x)
        return bias_relu(hidden, bias) if bias is not None else hidden.relu_()
    return ACTIVATIONS[activation](ffn.fc1.forward(x))
