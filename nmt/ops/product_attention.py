"""softmax(QK^T / sqrt(d_k)) V as two batched matrix products: `F.scaled_dot_product_attention`
without dropout, for CPU decoding, where a step's few queries per sentence or row cost PyTorch's
flash-attention kernel more than the products. tests/test_model.py checks it against the stock op.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def attention_by_products(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None) -> Tensor:
    """softmax(QK^T / sqrt(d_k)) V as two batched matrix products, `attn_mask` (True where
    attention is allowed) applied to the scores: `F.scaled_dot_product_attention` without dropout.

    For the encoder-decoder attention of a beam search step (a sentence's `beam` queries
    against its S source keys, no gradient), PyTorch's CPU flash-attention kernel cost more than
    these two products on an AMD CPU (`make bench-decoder-ops`,
    bench/results/2026-12-03_0970d33_zen4_bench-decoder-ops.json).
    k and v may be views with strides: they are multiplied in place, without a copy."""
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(q.size(-1) ** -0.5)
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v)
