"""Layer norm that keeps its output, not its input, for the backward (fp32 training on CPU).

In a post-LN block, y = LayerNorm(x + Dropout(Sublayer(x))), the sum is kept only for the
norm's backward, while y is kept anyway as the next product's input. The backward needs the
normalised rows x_hat = (y - beta) / gamma and the per-row 1 / std, so keeping those instead
frees one (tokens x d_model) fp32 tensor per norm, 15 in `small` (bench/results/2026-11-30_79fe883_sapphire-rapids_activations-kept-once.json; Apex's and Megatron's "memory-efficient" layer norm
do the same on GPUs). The division by gamma is exact enough while |gamma| is not tiny; a norm
with any |gamma| below `MIN_ABS_GAMMA` keeps its input as usual.

Only fp32 CPU training uses it: under bf16 autocast the next product keeps a bf16 copy of y,
not y itself, so keeping y would save nothing, and GPUs train in bf16.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

MIN_ABS_GAMMA = 1e-2
"""Below this |gamma|, (y - beta) / gamma loses too much precision; the input is kept instead."""


class OutputSavingLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (same parameters, same checkpoints) whose fp32 CPU training backward
    works from its output; elsewhere it is `nn.LayerNorm`."""

    def forward(self, x: Tensor) -> Tensor:
        if (x.device.type == "cpu" and x.dtype == torch.float32 and torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu") and self.weight is not None and self.bias is not None
                and len(self.normalized_shape) == 1 and bool(self.weight.detach().abs().min() >= MIN_ABS_GAMMA)):
            return _LayerNormSavingOutput.apply(x, self.weight, self.bias, self.eps)
        return super().forward(x)


class _LayerNormSavingOutput(torch.autograd.Function):
    """layer_norm(x) over the last dimension; the backward rebuilds x_hat from the output."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        y, _mean, rstd = torch.native_layer_norm(x, (x.size(-1),), weight, bias, eps)
        ctx.save_for_backward(y, weight, bias, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        y, weight, bias, rstd = ctx.saved_tensors
        inv_gamma = weight.reciprocal()
        x_hat = torch.addcmul(-bias * inv_gamma, y, inv_gamma)  # (y - beta) / gamma, in one pass
        # PyTorch's kernel given x_hat as an input with mean 0 and std 1 computes the weight
        # and bias gradients as they are, and the input gradient divided by the row's rstd.
        grad_x, grad_w, grad_b = torch.ops.aten.native_layer_norm_backward(
            grad_y, x_hat, (y.size(-1),), torch.zeros_like(rstd), torch.ones_like(rstd), weight, bias,
            [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]])
        if grad_x is not None:
            grad_x.mul_(rstd)
        return grad_x, grad_w, grad_b, None

