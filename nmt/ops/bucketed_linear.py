"""Linear layers whose bf16 matrix products on CPU see a few row counts, not one per batch.

oneDNN builds (JIT-compiles) a kernel for every new matrix shape it multiplies in bf16, and
every training batch brings new shapes: its sentences x padded length differs from the last
batch's. `ONEDNN_VERBOSE=profile_create` over `small`'s bf16 training showed dozens of kernels
built per update, a large share of the update spent before any arithmetic
(bench/results/2026-11-30_8af72b9_sapphire-rapids_bf16-one-set-of-shapes.json). A larger kernel
cache does not help, since those shapes never come back, and it costs memory.

`BucketedLinear` therefore multiplies a training batch's rows padded up to a multiple of
`row_multiple` (zeros, sliced off the result, and zeros in the gradient, so they change no
product: output and gradients are autocast's, bit for bit, the bias gradient included). The
trainer sets it to --max-tokens, which bounds a batch's rows, and the loss pads its short
chunks too: every update then multiplies the same 18 shapes, built in the first update and
found in oneDNN's cache afterwards. The padding costs arithmetic (more rows in the layers'
products). Only the bf16 autocast path on CPU pads; fp32 (MKL, no per-shape kernels), GPUs and
inference (no gradient) run `nn.Linear` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn



def padded_length(lengths: Any, multiple: int) -> Any:
    """`lengths` (an int or an array) rounded up to a multiple of `multiple`: the rows a bucketed
    product computes, and the width `nmt.data.batching.collate` pads a batch to."""
    return -(-lengths // multiple) * multiple if multiple > 1 else lengths


class BucketedLinear(nn.Linear):
    """`nn.Linear` (same parameters, same checkpoints) with bucketed rows under CPU bf16 training.

    `row_multiple` is 0 (off) until the training engine sets it (`nmt.ops.optimize_for`'s `row_multiple`).
    """

    row_multiple: int = 0

    def pads(self, x: Tensor) -> bool:
        """Whether this layer pads the rows of x: in CPU bf16 autocast, with gradients on."""
        return bool(self.row_multiple and x.device.type == "cpu" and torch.is_grad_enabled()
                    and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)

    def forward(self, x: Tensor) -> Tensor:
        if self.pads(x):
            rows = x.reshape(-1, x.size(-1))  # (B * T, in)
            out = self.padded(rows)[: rows.size(0)]
            return out.view(*x.shape[:-1], out.size(-1))
        return super().forward(x)

    def padded(self, rows: Tensor) -> Tensor:
        """The bf16 product over `rows` (n, in) padded to the bucket: (padded n, out), of which
        the first n rows are the result. Layers that only act row by row (ReLU, dropout) can
        work on the padded rows and hand them to the next `padded` without a new copy: the
        padded rows' values do not matter, since the gradient flowing back into them is zero
        (the caller slices the final output to n rows)."""
        return _PaddedRowsLinear.apply(rows, self.weight, self.bias, int(padded_length(rows.size(0), self.row_multiple)))


class _PaddedRowsLinear(torch.autograd.Function):
    """x @ W^T + b in bf16 over x's n rows padded with zeros to `rows` (x as it is when it
    already has `rows` bf16 rows); returns all `rows` rows of the result.

    Gradients are those of autocast's linear (products in bf16, weight gradient returned in
    fp32), given an output gradient that is zero in the padded rows. The bias gradient is
    summed as autocast sums it, in bf16 (fp32 accumulation, rounded once), to the precision
    of the weight gradient's bf16 product: an fp32 result from bf16 rows took several times as
    long (bench/results/2026-11-30_79fe883_sapphire-rapids_activations-kept-once.json).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, rows: int) -> Tensor:
        with torch.autocast("cpu", enabled=False):
            xb = rows_in_bucket(x, rows, torch.bfloat16)  # the cast autocast would make, into a padded buffer
            w = weight.to(torch.bfloat16)
            out = F.linear(xb, w, None if bias is None else bias.to(torch.bfloat16))  # (rows, out)
        ctx.save_for_backward(xb, w)
        ctx.n, ctx.x_dtype, ctx.has_bias = x.size(0), x.dtype, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        xb, w = ctx.saved_tensors
        with torch.autocast("cpu", enabled=False):
            g = rows_in_bucket(grad_out, xb.size(0), torch.bfloat16)  # (rows, out), zeros below the caller's rows
            grad_x = (g @ w)[: ctx.n].to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
            grad_w = (g.t() @ xb).float() if ctx.needs_input_grad[1] else None
            grad_b = g.sum(0).float() if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None


def rows_in_bucket(x: Tensor, rows: int, dtype: torch.dtype) -> Tensor:
    """x itself when it already is (rows, d) in `dtype` (its rows past the caller's were padded
    before), else `zero_padded_rows(x, rows, dtype)`."""
    if x.size(0) == rows and x.dtype == dtype and x.is_contiguous():
        return x
    return zero_padded_rows(x, rows, dtype)


def zero_padded_rows(x: Tensor, rows: int, dtype: torch.dtype) -> Tensor:
    """x (n, d) copied (and cast) into the first n rows of a (rows, d) tensor of zeros."""
    out = torch.empty((rows, x.size(1)), dtype=dtype, device=x.device)
    out[: x.size(0)].copy_(x)
    out[x.size(0):].zero_()
    return out
