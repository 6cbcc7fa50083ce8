"""Dropout on CPU with masks drawn 16 bits per element: `F.dropout` / `nn.Dropout` in distribution.

The numbers differ from F.dropout's only in which elements are dropped (the random draws);
each element is kept with probability 1 - p (to within 2^-16) and scaled by 1 / (1 - p), as
F.dropout does, and torch's seed still decides every mask. tests/test_model.py checks the
rate, the scale and the gradients against the stock op. GPUs keep F.dropout.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout(x, p, training), with the mask of a CPU tensor drawn 16 bits per element.

    On CPU, F.dropout draws its mask with `bernoulli_`, one double per element, a noticeable
    share of a training step over its many dropouts (bench/results/2026-11-30_4d5c99e_sapphire-rapids_cpu-dropout-and-loss-ab.json). `keep_mask` draws 16 random bits per element instead (see there). The mask
    keeps each element with probability 1 - p (to within 2^-16) and scales it by 1 / (1 - p),
    as F.dropout does; only the random numbers differ, and torch's seed still decides them.
    GPUs keep F.dropout.
    """
    if not training or p == 0.0:
        return x
    if not _cpu_mask_applies(x, p):
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


def _cpu_mask_applies(x: Tensor, p: float) -> bool:
    """Whether dropout of x at rate p (training) draws its mask with `keep_mask`: on CPU, for
    p < 1."""
    return x.device.type == "cpu" and p < 1.0


_SEED_RANGE = 2**62


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """Bool mask, True with probability 1 - p, from 16 random bits per element.

    The bits come from numpy's PCG64 (`random_raw`: 64 bits a draw, read as four int16
    uniform on [-2^15, 2^15)), seeded by a draw from torch's default generator, so that
    `torch.manual_seed` and a checkpoint's saved torch RNG state decide every mask, as they
    decided torch's own draws before. It took under half the time of torch's `random_` on
    int32 and two comparisons.
    """
    n = math.prod(shape)
    seed = int(torch.randint(0, _SEED_RANGE, (), dtype=torch.int64))
    bits = np.random.PCG64(seed).random_raw((n + 3) // 4).view(np.int16)[:n]
    threshold = min(round(p * 2**16) - 2**15, 2**15 - 1)  # an int16 (p within 2^-17 of 1 would overflow it)
    return torch.from_numpy(np.greater_equal(bits, np.int16(threshold))).view(shape)


def relu_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """dropout(ReLU(x), p, training), with one mask for both on CPU.

    ReLU's backward needs where x > 0, and dropout's which elements it kept. On CPU one byte
    mask (kept and positive) serves both, so the (tokens x d_ff) ReLU output is not kept for
    the backward and one pass over it is saved there (bench/results/2026-11-30_79fe883_sapphire-rapids_activations-kept-once.json). Elements where x == 0 get no gradient, as with F.relu. The numbers are
    those of `dropout(F.relu(x), p, training)` with the same random state.
    """
    if not training or p == 0.0 or not _cpu_mask_applies(x, p):
        return dropout(F.relu(x), p, training)
    keep = keep_mask(x.shape, p)
    keep &= x > 0
    return _MaskedScale.apply(x, keep, 1.0 / (1.0 - p))


class _MaskedScale(torch.autograd.Function):
    """x * keep * scale whose backward keeps only the bool mask (1 byte per element).

    The mask is multiplied in as uint8 (the same bytes): PyTorch's CPU kernels multiply a
    float tensor by a bool one through a converted copy of the mask, by a uint8 one without."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep.view(torch.uint8)).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep.view(torch.uint8)).mul_(ctx.scale), None, None


class CpuDropout(nn.Dropout):
    """`nn.Dropout` whose CPU masks come from `keep_mask` (`dropout` above)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
