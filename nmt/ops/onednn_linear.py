"""fp32 linear layers of CPU inference through oneDNN's matmul instead of MKL's sgemm, on AMD CPUs.

`nn.Linear` in fp32 on a CPU calls MKL's sgemm. On an AMD CPU oneDNN's matmul ran the products
of a beam search step faster, most in the vocabulary projection (`make bench-decoder-ops`,
bench/results/2026-12-03_0970d33_zen4_bench-decoder-ops.json), and the products are most of a
decoder step's time. CTranslate2 makes the same choice: MKL on Intel CPUs, oneDNN elsewhere. On
an Intel CPU oneDNN gained nothing
(bench/results/2026-12-05_17740f9_sapphire-rapids_bench-decoder-ops.json), so `nn.Linear` stays there.

Only inference in fp32 takes this path (no gradient: oneDNN's op here has no backward); bf16
weights, autocast and training run `nn.Linear` unchanged. Results equal F.linear's to float
rounding (another summation order): tests/test_model.py checks it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.ops.cpu_features import cpuinfo_field


def cpu_vendor() -> str:
    """The CPU's vendor_id (GenuineIntel, AuthenticAMD, ...), '' if unknown."""
    return cpuinfo_field("vendor_id")


def onednn_pays_off() -> bool:
    """Whether fp32 inference products go through oneDNN here: on AMD CPUs, when this torch
    has the op and it gives F.linear's result on a small product (a private op of PyTorch's
    compiler, so a release that changed it leaves nmt on `nn.Linear`, whose result is the same)."""
    return cpu_vendor() == "AuthenticAMD" and _onednn_works()


@lru_cache(maxsize=None)
def _onednn_works() -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    x, w, b = torch.linspace(-1, 1, 24).view(3, 8), torch.linspace(1, -1, 40).view(5, 8), torch.linspace(0, 1, 5)
    try:
        with torch.no_grad():
            return bool(torch.allclose(onednn_linear(x, w, b), F.linear(x, w, b), atol=1e-5))
    except (RuntimeError, TypeError):
        return False


def onednn_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """F.linear(x, weight, bias) by oneDNN's matmul, for fp32 CPU tensors without gradients."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def takes_onednn(x: Tensor, weight: Tensor) -> bool:
    """Whether a product of x and weight may take `onednn_linear`: fp32 on CPU, no gradient, no autocast."""
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu"))


class OneDnnLinear(nn.Linear):
    """`nn.Linear` (same parameters, same checkpoints) whose fp32 inference runs `onednn_linear`."""

    def forward(self, x: Tensor) -> Tensor:
        if takes_onednn(x, self.weight):
            return onednn_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
