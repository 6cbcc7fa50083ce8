"""A sublayer's output into the residual stream in one pass per row, in C++: "Add & Norm".

Each sublayer of the paper's layers ends in a linear layer, and its output is

    LayerNorm(x + Sublayer(x))   (Section 5.4; pre-LN: x + Sublayer(LayerNorm(x)))

For the rows of a decoder step PyTorch does that in three passes over the output, each an
operation of its own: the bias copied into the product's output before the product (that is how
`F.linear` adds it on a CPU: a tenth of the product's time at these sizes), the residual sum, the
layer norm. `add_and_norm` does the three after a product without bias, in one pass; `bias_relu`
does the same for the feed-forward's first layer and its ReLU (3.3). The mean and the biased
variance over the row are `torch.nn.LayerNorm`'s; their float rounding may differ in the last
bits. tests/test_add_and_norm.py checks both against the PyTorch operations. Built by
`nmt.ops.native`; used by the fp32 CPU decoder step (`nmt.ops.native_decoder_step`) with its C++
attention.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from nmt.ops.native import loaded

_NONE = torch.empty(0)
"""No bias, or no norm, for the C++ call."""


def add_and_norm(y: Tensor, bias: Optional[Tensor], x: Tensor, norm: Optional[nn.LayerNorm]) -> Tensor:
    """y := norm(x + y + bias) (post-LN), or x + y + bias where `norm` is None (pre-LN), in place:
    y (rows, d_model) contiguous, a sublayer's last product without its bias; returns y."""
    loaded().add_and_norm_(y, _NONE if bias is None else bias, x, _NONE if norm is None else norm.weight,
                           _NONE if norm is None else norm.bias, 0.0 if norm is None else norm.eps, norm is not None)
    return y


def bias_relu(y: Tensor, bias: Tensor) -> Tensor:
    """y := max(0, y + bias) in place, y (rows, C) contiguous; returns y."""
    loaded().bias_relu_(y, bias)
    return y
