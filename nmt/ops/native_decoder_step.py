"""The decoder step of fp32 CPU inference on nmt's C++ kernels (`nmt.ops.native`): the same
maths as `Transformer.decode_step_hidden` (stock modules, one `SelfAttentionCache` per layer),
in far fewer operations.

A beam search step on a CPU is hundreds of small PyTorch operations, and at the batch sizes
of translation each costs more in Python and operator set-up than in arithmetic (#30). This
step computes the same layers from their parameters with fewer:

- self-attention over a cache that is never reordered, read through each row's ancestors
  (`nmt.ops.ancestor_attention.AncestorSelfAttentionCache`), by a C++ loop;
- the encoder-decoder attention in one pass per row (`nmt.ops.ancestor_attention.source_attention`);
- each sublayer's last product without its bias, then bias, residual sum and layer norm in one
  pass (`nmt.ops.add_and_norm`); ReLU and fc1's bias likewise;
- projections through the layers' `forward` (which keeps a device's choice of product,
  `nmt.ops.onednn_linear`), without `nn.Module.__call__`.

It is one of the two CPU decoding paths (`nmt.ops.optimize_for` picks one per model, and
`nmt translate` names it): this one where the kernels build, the stock step elsewhere or with
`--decoder stock`. tests/ops/test_native_decoder_step.py checks it against the stock step
(logits at every step, through reorders and sentences leaving the batch) and the searches'
outputs against the stock model's."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.model.transformer import ACTIVATIONS, FeedForward, MultiHeadAttention, Residual, Transformer
from nmt.ops.add_and_norm import add_and_norm, bias_relu
from nmt.ops.ancestor_attention import AncestorDecoderState, AncestorSelfAttentionCache, source_attention
from nmt.ops.onednn_linear import OneDnnLinear


def native_decode_step_hidden(model: Transformer, tokens: Tensor, state: AncestorDecoderState) -> Tensor:
    """`Transformer.decode_step_hidden` over an `AncestorDecoderState`: feed one token per row,
    return the decoder states (rows, d_model) and advance `state`."""
    cfg = model.cfg
    # Dropout(sqrt(d_model) * E[tokens] + PE[step]), dropout off (3.4, 3.5)
    x = F.embedding(tokens, model.tgt_embed.weight).mul_(model.embed_scale).add_(model.positions[state.step])
    for layer, cache, memory_kv in zip(model.decoder_layers, state.caches, state.memory_kv):
        # each sublayer up to its last product, then "Add & Norm" in C++ (nmt.ops.add_and_norm)
        x = _add_and_norm(layer.self_block, x, layer.self_attn.out_proj, _self_attention_heads, layer.self_attn, cache)
        x = _add_and_norm(layer.cross_block, x, layer.cross_attn.out_proj, _cross_attention_heads, layer.cross_attn,
                          memory_kv, state.memory_mask, state.sentences)
        x = _add_and_norm(layer.ffn_block, x, layer.ffn.fc2, _feed_forward_hidden, layer.ffn, cfg.activation)
    if model.decoder_norm is not None:
        x = _layer_norm(model.decoder_norm, x)
    state.step += 1
    return x


def _add_and_norm(block: Residual, x: Tensor, last: torch.nn.Linear, inner: Callable[..., Tensor], *args: Any) -> Tensor:
    """`Residual` without dropout (LayerNorm(x + Sublayer(x)), post-LN, the paper; or
    x + Sublayer(LayerNorm(x)), pre-LN) whose sublayer is `inner(x, *args)` followed by the linear
    layer `last`: the product without its bias, then the bias, the residual sum and (post-LN) the
    layer norm in one pass. (A device's own product, `OneDnnLinear`, adds its bias itself.)"""
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


def _self_attention_heads(x: Tensor, attn: MultiHeadAttention, cache: AncestorSelfAttentionCache) -> Tensor:
    """Masked self-attention of one new position over the cached ones (3.2.3), x (rows, d_model),
    before its output projection, by the C++ loop over the unreordered cache:
    Concat(head_1, ..., head_h), (rows, d_model)."""
    n, d_model = x.shape
    heads, d_head = attn.n_heads, attn.d_head
    qkv = attn.qkv_proj.forward(x)  # (rows, 3 d_model): Q | K | V
    out = cache.attend(qkv[:, :d_model].view(n, heads, d_head), qkv[:, d_model:].view(n, 2, heads, d_head))
    return out.view(n, d_model)


def _cross_attention_heads(x: Tensor, attn: MultiHeadAttention, memory_kv: tuple[Tensor, Tensor],
                           memory_mask: Optional[Tensor], sentences: Tensor) -> Tensor:
    """Encoder-decoder attention (3.2.3) before its output projection, in one pass by the C++ loop
    (`nmt.ops.ancestor_attention.source_attention`; live sentence i reads entry sentences[i] of
    the keys and values): Concat(head_1, ..., head_h), (rows, d_model)."""
    n, d_model = x.shape
    k_t, v = memory_kv
    q = attn.q_proj.forward(x).view(n, attn.n_heads, attn.d_head)
    return source_attention(q, k_t, v, memory_mask, sentences).view(n, d_model)


def _feed_forward_hidden(x: Tensor, ffn: FeedForward, activation: str) -> Tensor:
    """max(0, x W1 + b1) of FFN(x) = max(0, x W1 + b1) W2 + b2 (3.3), the ReLU and bias in one
    pass (`nmt.ops.add_and_norm.bias_relu`); another activation as `FeedForward` has it."""
    if activation == "relu":
        hidden, bias = _product_before_bias(ffn.fc1, x)
        return bias_relu(hidden, bias) if bias is not None else hidden.relu_()
    return ACTIVATIONS[activation](ffn.fc1.forward(x))
