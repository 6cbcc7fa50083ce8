"""The same maths as a stock torch op, faster or leaner on one device.

Each module names the stock op it equals and is tested against it. `optimize_for` swaps them
into a model built from `nmt.model.transformer` (which uses stock ops only) where they pay off,
in place: the classes change, the parameters and checkpoint keys do not.

| device | op | replaces | why |
| --- | --- | --- | --- |
| CPU | `attention.CpuMultiHeadAttention` | `F.scaled_dot_product_attention` | bf16 attention backward 3-5x slower than fp32 |
| CPU | `attention.CpuTransformer` | the source mask | no mask when a batch has no padding: faster kernel |
| CPU | `cpu_decoder_step` (via `CpuTransformer`) | `Transformer.decode_step_hidden`, `SelfAttentionCache` (inference, fp32) | fewer operations per beam search step, one cache gather per layer |
| CPU | `ancestor_attention.AncestorSelfAttentionCache` (via `cpu_decoder_step`, where `native`'s C++ kernels build) | the cache gather and `F.scaled_dot_product_attention` (inference, fp32) | the cache is never reordered: keys read through each row's ancestors, 3-5x faster |
| CPU | `ancestor_attention.source_attention` (with the cache above) | `product_attention.attention_by_products` (encoder-decoder, inference, fp32) | one pass per row instead of two small batched products and a softmax |
| CPU | `add_and_norm.add_and_norm`, `bias_relu` (with the cache above) | the bias of `F.linear`, the residual sum, `F.layer_norm`, ReLU (inference, fp32) | one pass over a sublayer's output instead of three or two |
| CPU | `vocabulary_top.vocabulary_top` (via `CpuTransformer.fused_vocabulary_top`, one model) | `log_softmax`, the masks, the block top-k and eos's column of a search step | one read of each row of logits instead of five passes |
| CPU | `dropout.CpuDropout` | `nn.Dropout` | masks from 16 random bits, not a double, per element |
| CPU | `feed_forward.CpuFeedForward` | ReLU + dropout | one byte mask for both; padded bf16 rows kept once |
| CPU | `bucketed_linear.BucketedLinear` | `nn.Linear` | bf16 training rows padded: oneDNN builds kernels once |
| CPU | `output_saving_layer_norm.OutputSavingLayerNorm` | post-LN `nn.LayerNorm` | fp32 backward keeps the output only |
| AMD CPU | `onednn_linear.OneDnnLinear`, `CpuTransformer.project_fp32` | `nn.Linear`, `F.linear` (inference, fp32) | oneDNN's matmul beats MKL's sgemm there |
| GPU | `attention.GpuMultiHeadAttention` | `F.scaled_dot_product_attention` | no cuDNN kernel: it plans every shape on the host |
"""

from __future__ import annotations

from typing import Optional

import torch


def optimize_for(model: torch.nn.Module, device: torch.device, dtype: Optional[torch.dtype] = None,
                 row_multiple: int = 0, inference: bool = False) -> torch.nn.Module:
    """Give `model` (an `nmt.model.transformer.Transformer`) the ops that pay off on `device`
    for work in `dtype` (the autocast or weight dtype; None: fp32). `row_multiple` > 0 buckets
    the rows of bf16 CPU training products (the trainer passes --max-tokens); `inference`
    (translation, never trained) lets fp32 products take oneDNN where it pays off. Returns `model`."""
    from torch import nn

    from nmt.model.transformer import FeedForward, MultiHeadAttention, Residual, Transformer

    if device.type == "cuda":
        from nmt.ops.attention import GpuMultiHeadAttention

        for module in model.modules():
            if type(module) is MultiHeadAttention:
                module.__class__ = GpuMultiHeadAttention
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
    if inference and dtype in (None, torch.float32):
        from nmt.ops.native import native_module

        native_module()  # built (once per CPU) as the model loads, not at the first sentence
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
    return model
