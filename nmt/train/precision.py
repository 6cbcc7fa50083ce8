"""Mixed precision: bf16 autocast, fp16 with dynamic loss scaling, or plain fp32.

Master weights and the optimizer stay fp32 in every mode; autocast runs matrix products in
the low-precision type. fp16 needs loss scaling (Micikevicius et al., 2018): an overflow skips
the update and halves the scale; a scale that keeps collapsing means the model diverges in
fp16, so training stops with a clear message instead of silently skipping forever
(fairseq#2488).
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext
from typing import Any, ContextManager, Iterable

import torch
from torch import Tensor

from nmt.device import resolve_amp
from nmt.errors import NmtError


ONEDNN_CACHE_CAPACITY = "24"
"""oneDNN primitives (kernels built for one matrix shape) cached for bf16 matmuls on CPU (its
default is 1024). Training pads the rows of its bf16 products to --max-tokens
(`nmt.ops.bucketed_linear`), so one update of any architecture uses the same 18 shapes (five linear
layer kinds, a forward and two backward products each, less two shared, and the loss's three):
24 entries hold them all, built in the first update (`ONEDNN_VERBOSE=profile_create`); at 16
they evicted one another and each update built them again, and without padding a larger cache
only kept shapes that never came back while memory grew
(bench/results/2026-11-30_8af72b9_sapphire-rapids_bf16-one-set-of-shapes.json). The environment
variable ONEDNN_PRIMITIVE_CACHE_CAPACITY, if set, wins."""

IDEEP_CACHE_CAPACITY = "16"
"""Entries of ideep's own per-shape cache in front of oneDNN (PyTorch's LRU_CACHE_CAPACITY,
default 1024). With batches of ever new shapes the default grew bf16 training's memory without
levelling off; at 16 it levels off, below fp32's, and trains as fast
(bench/results/2026-11-30_4dbe3b0_sapphire-rapids_bf16-caches.json). The environment variable,
if set, wins."""


class Precision:
    """One training process's precision policy."""

    def __init__(self, name: str, device: torch.device, min_loss_scale: float = 1e-4):
        self.name, self.device, self.min_loss_scale = name, device, min_loss_scale
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=2.0**7) if name == "fp16" else None

    @classmethod
    def create(cls, amp: str, device: torch.device, min_loss_scale: float = 1e-4) -> "Precision":
        """Resolve `auto` (training's meaning, `nmt.device.resolve_amp`) and check the device can do what was asked."""
        amp = resolve_amp(amp, device, "train")
        if amp == "none":
            return cls("fp32", device)
        if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise NmtError("this GPU does not support bf16; use --amp fp16 or --amp none")
        if amp == "bf16" and device.type == "cpu":
            os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY)  # read at the first bf16 matmul
            os.environ.setdefault("LRU_CACHE_CAPACITY", IDEEP_CACHE_CAPACITY)  # likewise
        return cls(amp, device, min_loss_scale)

    def autocast(self) -> ContextManager:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_and_clip(self, optimizer: torch.optim.Optimizer, params: Iterable[Tensor], clip_norm: float) -> tuple[float, bool]:
        """Gradient norm before clipping, and whether it is finite (else skip the update)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        params = [p for p in params if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else math.inf)
        gnorm = float(norm)
        return gnorm, math.isfinite(gnorm)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def update(self, skipped: bool) -> None:
        """After a skipped update: lower the fp16 scale, and stop if it collapsed."""
        if self.scaler is None:
            return
        self.scaler.update()
        if self.scaler.get_scale() < self.min_loss_scale:
            raise NmtError(
                f"fp16 loss scale fell below --min-loss-scale {self.min_loss_scale}: gradients overflow "
                f"even at tiny scales, so the model diverges in fp16; use --amp bf16, lower the learning rate, or add --clip-norm"
            )

    def scale_value(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
