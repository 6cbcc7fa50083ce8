"""The same maths as a stock torch op, faster or leaner on one device.

Each module names the stock op it equals and is tested against it. `optimize_for` swaps them
into a model built from `nmt.model.transformer` (which uses stock ops only) where they pay off,
in place: the classes change, the parameters and checkpoint keys do not.

| device | op | replaces | why |
| --- | --- | --- | --- |
| CPU | `attention.CpuMultiHeadAttention` | `F.scaled_dot_product_attention` | bf16 attention backward several times slower than fp32 |
| CPU | `attention.CpuTransformer` | the source mask | no mask when a batch has no padding: faster kernel |
| CPU | `native_decoder_step` (via `CpuTransformer`, the native path: `decoder_path`) | `Transformer.decode_step_hidden`, `SelfAttentionCache` (inference, fp32) | a step in far fewer operations, on nmt's C++ kernels (`native`) |
| CPU | `ancestor_attention.AncestorSelfAttentionCache` (in that step) | the cache gather and `F.scaled_dot_product_attention` | the cache is never reordered: keys read through each row's ancestors |
| CPU | `ancestor_attention.source_attention` (in that step) | `product_attention.attention_by_products` (encoder-decoder) | one pass per row instead of two small batched products and a softmax |
| CPU | `add_and_norm.add_and_norm`, `bias_relu` (in that step) | the bias of `F.linear`, the residual sum, `F.layer_norm`, ReLU | one pass over a sublayer's output instead of three or two |
| CPU | `vocabulary_top.vocabulary_top` (`fused_vocabulary_top`, the native path, one model) | `log_softmax`, the masks, the block top-k and eos's column of a search step | one read of each row of logits instead of five passes |
| CPU | `dropout.CpuDropout` | `nn.Dropout` | masks from 16 random bits, not a double, per element |
| CPU | `feed_forward.CpuFeedForward` | ReLU + dropout | one byte mask for both; padded bf16 rows kept once |
| CPU | `bucketed_linear.BucketedLinear` | `nn.Linear` | bf16 training rows padded: oneDNN builds kernels once |
| CPU | `output_saving_layer_norm.OutputSavingLayerNorm` | post-LN `nn.LayerNorm` | fp32 backward keeps the output only |
| AMD CPU | `onednn_linear.OneDnnLinear`, `CpuTransformer.project_fp32` | `nn.Linear`, `F.linear` (inference, fp32) | oneDNN's matmul beats MKL's sgemm there |
| CPU, GPU | `attention.Fp32Projection.project_fp32` | `Transformer.project_fp32` (bf16/fp16 weights) | one fp32 copy of the output weights, not one per step |
| GPU | `attention.GpuMultiHeadAttention` | `F.scaled_dot_product_attention` | no cuDNN kernel: it plans every shape on the host |
"""

from __future__ import annotations

import os
from functools import partial
from typing import Callable, Optional

import torch
from torch import Tensor


def optimize_for(model: torch.nn.Module, device: torch.device, dtype: Optional[torch.dtype] = None,
                 row_multiple: int = 0, inference: bool = False, decoder: str = "auto") -> torch.nn.Module:
    """Give `model` (an `nmt.model.transformer.Transformer`) the ops that pay off on `device`
    for work in `dtype` (the autocast or weight dtype; None: fp32). `row_multiple` > 0 buckets
    the rows of bf16 CPU training products (the trainer passes --max-tokens); `inference`
    (translation, never trained) lets fp32 products take oneDNN where it pays off, and chooses
    the decoding path once, by `decoder` (auto, native or stock: `nmt.inference.config.DECODERS`),
    recorded as `model.decoder_path`: only fp32 CPU inference builds or loads the C++ kernels,
    never training or export. Returns `model`."""
    from torch import nn

    from nmt.model.transformer import FeedForward, MultiHeadAttention, Residual, Transformer

    if device.type == "cuda":
        from nmt.ops.attention import GpuMultiHeadAttention, GpuTransformer

        for module in model.modules():
            if type(module) is MultiHeadAttention:
                module.__class__ = GpuMultiHeadAttention
        if type(model) is Transformer:
            model.__class__ = GpuTransformer
        return model
    if device.type != "cpu":
        return model

    from nmt.ops.attention import CpuMultiHeadAttention, CpuTransformer
    from nmt.ops.bucketed_linear import BucketedLinear
    from nmt.ops.dropout import CpuDropout
    from nmt.ops.feed_forward import CpuFeedForward
    from nmt.ops.onednn_linear import OneDnnLinear, onednn_pays_off
    from nmt.ops.output_saving_layer_norm import OutputSavingLayerNorm

    bucket = row_multiple if dtype == torch.bfloat16 else 0
    onednn = inference and dtype in (None, torch.float32) and onednn_pays_off()
    path = _decoder_path(decoder) if inference and dtype in (None, torch.float32) else "stock"
    for module in list(model.modules()):
        if type(module) in (MultiHeadAttention, FeedForward):
            for linear in module.children():
                if type(linear) is not nn.Linear:
                    continue
                if onednn:
                    linear.__class__ = OneDnnLinear
                else:
                    linear.__class__ = BucketedLinear
                    linear.row_multiple = bucket
            module.__class__ = CpuMultiHeadAttention if type(module) is MultiHeadAttention else CpuFeedForward
        elif type(module) is nn.Dropout:
            module.__class__ = CpuDropout
        elif type(module) is Residual and not module.pre_ln and type(module.norm) is nn.LayerNorm:
            module.norm.__class__ = OutputSavingLayerNorm
    if type(model) is Transformer:
        model.__class__ = CpuTransformer
        model.onednn_projection = onednn
        model.decoder_path = path
    return model


def _decoder_path(decoder: str) -> str:
    """"native" where asked or auto and the C++ kernels build or load (as the model loads, not at
    its first sentence; NMT_NATIVE_KERNELS=0 is --decoder stock), else "stock"."""
    if decoder == "stock":
        return "stock"
    from nmt.ops.native import DISABLE_ENV, native_module

    if native_module() is not None:
        return "native"
    if decoder == "native":
        from nmt.errors import NmtError

        why = f"{DISABLE_ENV}=0 is set" if os.environ.get(DISABLE_ENV) == "0" else "they cannot be built here (said above)"
        raise NmtError(f"--decoder native needs nmt's C++ kernels, and {why}; use --decoder stock or auto")
    return "stock"


def decoder_path(model: torch.nn.Module) -> str:
    """The decoding path `optimize_for` chose for `model`: "native" or "stock" (also for a model
    it never saw, or one on a GPU)."""
    return getattr(model, "decoder_path", "stock")


def fused_vocabulary_top(model: torch.nn.Module) -> Optional[Callable[[Tensor, Tensor, Tensor, Tensor], None]]:
    """On the native path, the C++ one-pass log_softmax and ranking of a block of logits for a
    search of `model` alone, f(logits, values, tokens, eos) (`nmt.ops.vocabulary_top`); else None,
    and the search ranks with its PyTorch operations (`nmt.inference.beam_search.row_candidates`)."""
    if decoder_path(model) != "native":
        return None
    from nmt.ops.vocabulary_top import vocabulary_top

    return partial(vocabulary_top, ids=model.cfg.special_ids)
