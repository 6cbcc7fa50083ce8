"""Attention kernels for one device: `F.scaled_dot_product_attention` with the same result.

`nmt.model.transformer.MultiHeadAttention.attention` is the stock op; `nmt.ops.optimize_for`
gives a model's attention layers one of the classes below, which override only that method.
tests/test_model.py and tests/test_gemm_rows.py check each against the stock op.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmt.model.incremental import Cache, DecoderState
from nmt.model.transformer import EncoderOut, MultiHeadAttention, Transformer
from nmt.ops.ancestor_attention import AncestorDecoderState, AncestorSelfAttentionCache
from nmt.ops.native_decoder_step import native_decode_step_hidden
from nmt.ops.onednn_linear import onednn_linear, takes_onednn
from nmt.ops.product_attention import attention_by_products


def cpu_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                  is_causal: bool = False) -> Tensor:
    """`F.scaled_dot_product_attention` on CPU, attended in fp32 for bf16/fp16 inputs, and
    without a mask that allows every position.

    PyTorch's CPU flash-attention backward in bf16 runs several times slower than in fp32, and
    it dominated a bf16 training step (bench/results/2026-11-30_ad3985d_zen4_bf16-profile.json),
    so bf16 or fp16 inputs are attended in fp32 and the result cast back; the projections
    around it stay in bf16. For the backward, q, k and v are kept as they came, in bf16, and
    cast again there (exactly, so the gradients are unchanged): their fp32 copies, which it
    would otherwise keep, were a quarter of what a bf16 step kept for its backward
    (bench/results/2026-11-30_79fe883_sapphire-rapids_activations-kept-once.json).
    """
    # Any of the three decides (a query may arrive in fp32 beside bf16 k, v).
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
bringing new shapes: in a profile of `big`'s training a cuDNN attention call took far more host
time than GPU time, so the GPU waited for the host. Flash attention (no mask) and the
memory-efficient kernel (padding masks) have no per-shape cost, and training and translation
ran much faster without cuDNN's (bench/results/2026-11-30_b968069_h200_gpu-attention-ab.json,
bench/results/2026-11-30_b968069_h200_gpu-translate.json)."""


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
        if not (self.self_attention or q.dtype != torch.float32 or torch.is_grad_enabled()):
            return attention_by_products(q, k, v, attn_mask)
        return cpu_attention(q, k, v, attn_mask, dropout_p, is_causal)


class GpuMultiHeadAttention(MultiHeadAttention):
    """MultiHeadAttention whose attention is `gpu_attention` (same parameters)."""

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                  is_causal: bool = False) -> Tensor:
        return gpu_attention(q, k, v, attn_mask, dropout_p, is_causal)


class Fp32Projection(Transformer):
    """A Transformer (same parameters) whose fp32 logits from reduced-precision weights reuse
    one fp32 copy of the output weights: a beam search projects every step, and converting the
    (vocabulary, d_model) matrix each time would cost as much as the product."""

    def project_fp32(self, hidden: Tensor) -> Tensor:
        source, bias = self.output_weight, self.output_bias
        if source.dtype == torch.float32 and hidden.dtype == torch.float32:
            return F.linear(hidden, source, bias)
        key = (source.data_ptr(), source._version)  # a training step changes _version
        cached = getattr(self, "_output_weight_fp32", None)
        if cached is None or cached[0] != key:
            cached = self._output_weight_fp32 = (key, source.detach().float())
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), cached[1], None if bias is None else bias.detach().float())


class GpuTransformer(Fp32Projection):
    """The Transformer as `nmt.ops.optimize_for` gives it a GPU: only the cached fp32 projection."""


class CpuTransformer(Fp32Projection):
    """A Transformer (same parameters) whose source mask is None for a batch without padding:
    PyTorch's CPU attention runs faster without a mask than with one that allows everything.
    (On a GPU, asking whether there is padding would make the host wait for the device, so it
    always passes the mask.) In fp32
    inference on AMD CPUs its vocabulary projection runs oneDNN's matmul (`nmt.ops.onednn_linear`),
    and where `decoder_path` is "native" it decodes step by step on nmt's C++ kernels
    (`nmt.ops.native_decoder_step`)."""

    onednn_projection: bool = False
    """Whether fp32 inference projects to the vocabulary through `nmt.ops.onednn_linear` (set by `optimize_for`)."""
    decoder_path: str = "stock"
    """"native" (nmt's C++ kernels) or "stock" (the model's own step): set by `optimize_for`."""

    def source_mask(self, src_tokens: Tensor) -> Optional[Tensor]:
        if bool(src_tokens.eq(self.cfg.pad_id).any()):
            return super().source_mask(src_tokens)
        return None

    def init_decoder_state(self, enc: EncoderOut, beam: int = 1,
                           cache: Optional[Callable[[], Cache]] = None) -> DecoderState:
        """On the native path, without a `cache` given, in fp32 without autograd or autocast: a
        state whose caches the C++ loop reads through ancestor tables; else the stock one."""
        if cache is None and self.decoder_path == "native" and (
                enc.states.dtype == torch.float32 and not self.training and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu")):
            return AncestorDecoderState.adopt(super().init_decoder_state(enc, beam, AncestorSelfAttentionCache))
        return super().init_decoder_state(enc, beam, cache)

    def decode_step_hidden(self, tokens: Tensor, state: DecoderState) -> Tensor:
        if isinstance(state, AncestorDecoderState):
            return native_decode_step_hidden(self, tokens, state)
        return super().decode_step_hidden(tokens, state)

    def project_fp32(self, hidden: Tensor) -> Tensor:
        if self.onednn_projection and takes_onednn(hidden, self.output_weight):
            return onednn_linear(hidden, self.output_weight, self.output_bias)
        return super().project_fp32(hidden)
