"""Attention kernels for one device: `F.scaled_dot_product_attention` with the same result.

`nmt.model.transformer.MultiHeadAttention.attention` is the stock op; `nmt.ops.optimize_for`
gives a model's attention layers one of the classes below, which override only that method.
tests/test_model.py and tests/test_gemm_rows.py check each against the stock op.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmt.model.incremental import Cache, DecoderState
from nmt.model.transformer import EncoderOut, MultiHeadAttention, Transformer
from nmt.ops.ancestor_attention import AncestorDecoderState, AncestorSelfAttentionCache
from nmt.ops.cpu_decoder_step import PackedSelfAttentionCache, packed_decode_step_hidden
from nmt.ops.native import native_module, ready as native_ready
from nmt.ops.onednn_linear import onednn_linear, takes_onednn
from nmt.ops.product_attention import attention_by_products
from nmt.ops.vocabulary_top import vocabulary_top


def cpu_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                  is_causal: bool = False) -> Tensor:
    """`F.scaled_dot_product_attention` on CPU, attended in fp32 for bf16/fp16 inputs, and
    without a mask that allows every position.

    PyTorch's CPU flash-attention backward in bf16 runs 3-5x slower than in fp32 (measured on
    AMX and AVX512-BF16 Xeons, torch 2.13), and it dominated a bf16 training step, so bf16 or
    fp16 inputs are attended in fp32 and the result cast back; the projections around it stay
    in bf16. For the backward, q, k and v are kept as they came, in bf16, and cast again there
    (exactly, so the gradients are unchanged): their fp32 copies, which it would otherwise
    keep, were 98 of the 365 MiB a `small` bf16 step at 4096 tokens kept for its backward.
    """
    # Any of the three decides: under torch.compile the query can arrive in fp32 beside bf16 k, v.
    low = next((t.dtype for t in (q, k, v) if t.dtype in (torch.bfloat16, torch.float16)), None)
    if low is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    q32, k32, v32 = q.float(), k.float(), v.float()
    with torch.autocast("cpu", enabled=False), _keep_as_cast_from(((q32, q), (k32, k), (v32, v))):
        out = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    return out.to(low)


@contextmanager
def _keep_as_cast_from(casts: tuple[tuple[Tensor, Tensor], ...]) -> Iterator[None]:
    """Saved-tensor hooks under which autograd keeps the source of a cast `(copy, source)`
    instead of the copy whenever it saves the copy, and casts it again when the backward
    needs it. Up-casts (bf16 -> fp32) are exact, so the backward sees the same numbers.

    Autograd keeps both hooks as long as it keeps what they saved, so they refer to the
    copies by id only (and only while this context is open): a reference would keep them alive.
    """
    sources = {id(copy): source for copy, source in casts}

    def pack(t: Tensor) -> object:
        source = sources.get(id(t))
        return t if source is None else _CastAgain(source, t.dtype)

    def unpack(packed: object) -> Tensor:
        return packed.source.to(packed.dtype) if isinstance(packed, _CastAgain) else packed

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
    finally:
        sources.clear()


class _CastAgain(NamedTuple):
    """A saved tensor kept as the source it was cast from (`_keep_as_cast_from`)."""

    source: Tensor
    dtype: torch.dtype


GPU_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""The attention kernels PyTorch may choose from on a GPU: cuDNN's is left out.
PyTorch prefers it on Hopper, but it plans every new shape on the host, and training batches
(each its own sentence count and length) and beam search (a new key length every step) keep
bringing new shapes: profiling `big` at 25k tokens on an H200 (torch 2.11) showed 9 ms of CPU
per cuDNN attention call against 0.2-0.3 ms of GPU work, so the GPU waited for the host. Flash
attention (no mask) and the memory-efficient kernel (padding masks) have no per-shape cost:
training `big` went from 126 to 80 ms per update (100k -> 159k target tok/s) and `nmt
translate` of a `base` model from 14-16 to 80-84 sentences/s."""


def gpu_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                  is_causal: bool = False) -> Tensor:
    """`F.scaled_dot_product_attention` with the kernels of GPU_ATTENTION_BACKENDS only."""
    with sdpa_kernel(GPU_ATTENTION_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


class CpuMultiHeadAttention(MultiHeadAttention):
    """MultiHeadAttention whose attention is `cpu_attention` (same parameters); in fp32
    inference its encoder-decoder attention is `attention_by_products`."""

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                  is_causal: bool = False) -> Tensor:
        if not (self.self_attention or q.dtype != torch.float32 or torch.is_grad_enabled() or torch.compiler.is_compiling()):
            return attention_by_products(q, k, v, attn_mask)
        return cpu_attention(q, k, v, attn_mask, dropout_p, is_causal)


class GpuMultiHeadAttention(MultiHeadAttention):
    """MultiHeadAttention whose attention is `gpu_attention` (same parameters)."""

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                  is_causal: bool = False) -> Tensor:
        return gpu_attention(q, k, v, attn_mask, dropout_p, is_causal)


class CpuTransformer(Transformer):
    """A Transformer (same parameters) whose source mask is None for a batch without padding:
    PyTorch's CPU attention runs faster without a mask than with one that allows everything.
    (On a GPU, asking whether there is padding would make the host wait for the device, and
    graphs under torch.compile keep one shape of call, so both always pass the mask.) In fp32
    inference on AMD CPUs its vocabulary projection runs oneDNN's matmul (`nmt.ops.onednn_linear`),
    and fp32 inference decodes step by step with `nmt.ops.cpu_decoder_step` (same maths, fewer operations);
    a search of it alone ranks each block of logits with `nmt.ops.vocabulary_top`."""

    onednn_projection: bool = False
    """Whether fp32 inference projects to the vocabulary through `nmt.ops.onednn_linear` (set by `optimize_for`)."""

    def source_mask(self, src_tokens: Tensor) -> Optional[Tensor]:
        if torch.compiler.is_compiling() or bool(src_tokens.eq(self.cfg.pad_id).any()):
            return super().source_mask(src_tokens)
        return None

    def init_decoder_state(self, enc: EncoderOut, beam: int = 1,
                           cache: Optional[Callable[[], Cache]] = None) -> DecoderState:
        """Without a `cache` given, fp32 inference (no autograd, autocast or compiler) decodes
        with the packed step, over caches read through ancestor tables by the C++ loop where it
        is built (`nmt.ops.ancestor_attention`, in an `AncestorDecoderState`), else over its
        packed caches; anything else with the stock ones."""
        if cache is None and (self.output_weight.dtype == torch.float32 and enc.states.dtype == torch.float32
                              and not self.training and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
                              and not torch.compiler.is_compiling()):
            cache = AncestorSelfAttentionCache if native_module() is not None else PackedSelfAttentionCache
        state = super().init_decoder_state(enc, beam, cache)
        return AncestorDecoderState.adopt(state) if cache is AncestorSelfAttentionCache else state

    def decode_step_hidden(self, tokens: Tensor, state: DecoderState) -> Tensor:
        if state.caches and isinstance(state.caches[0], (PackedSelfAttentionCache, AncestorSelfAttentionCache)):
            return packed_decode_step_hidden(self, tokens, state)
        return super().decode_step_hidden(tokens, state)

    @property
    def fused_vocabulary_top(self) -> Optional[Callable[[Tensor, Tensor, Tensor, Tensor], None]]:
        """`nmt.ops.vocabulary_top`'s C++ loop, where this process has it built (fp32 inference
        builds it as the model loads: `nmt.ops.optimize_for`)."""
        return partial(vocabulary_top, ids=self.cfg.special_ids) if native_ready() is not None else None

    def project_fp32(self, hidden: Tensor) -> Tensor:
        if self.onednn_projection and takes_onednn(hidden, self.output_weight):
            return onednn_linear(hidden, self.output_weight, self.output_bias)
        return super().project_fp32(hidden)
