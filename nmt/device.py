"""Where a command runs and in what precision: `--device` and `--amp auto`, for training and
translation alike.

`nmt train`, `nmt translate`, `nmt serve`, `nmt.load`, the recipes and the benches all resolve
`--device` here, and ask `resolve_amp` what `--amp auto` means for the device and the purpose.
Commands that run several local processes (training ranks, distill workers) start them with
`worker_processes`.
"""

from __future__ import annotations

import multiprocessing
from functools import lru_cache

import torch

from nmt.errors import NmtError
from nmt.ops.cpu_features import cpu_flags

AMP_PURPOSES = ("train", "translate")
"""What a precision is chosen for: `--amp auto` means something else for each (`resolve_amp`)."""


def resolve_device(name: str) -> torch.device:
    """`--device` as a torch device: auto is the GPU when PyTorch sees one, else the CPU; a
    CUDA device without a GPU, or a name torch does not know, is refused in one line."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise NmtError(f"unknown --device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NmtError("--device cuda was asked for, but PyTorch sees no GPU; use --device cpu")
    return device


@lru_cache(maxsize=None)
def cpu_bf16_units() -> tuple[bool, str]:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX), and the evidence.

    Without such units oneDNN emulates bf16 matmuls, slower than fp32, so bf16 is never chosen
    automatically there.
    """
    units = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    onednn = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if units:
        return True, f"cpu flags {', '.join(units)}; oneDNN bf16 support {onednn}"
    return False, ("the CPU flags show neither avx512_bf16 nor amx_bf16, so bf16 matrix products would be "
                   "emulated, slower than fp32")


def resolve_amp(amp: str, device: torch.device, purpose: str) -> str:
    """`--amp` as given, or what `auto` means on `device` for `purpose` (one of AMP_PURPOSES).
    The two meanings, side by side:

    - train: bf16 on a GPU that supports it and on a CPU with bf16 matrix units (AVX512-BF16 or
      AMX, `cpu_bf16_units`); else none, the paper's fp32. On such CPUs bf16 autocast trains
      the recipe's models faster than fp32 (most with AMX; its products keep one set of shapes,
      `nmt.ops.bucketed_linear`) with fp32's loss curve: docs/performance.md, "When bf16", and
      bench/results/2026-11-29_8860446_machine-unknown_bf16-vs-fp32-curve.json.
    - translate: bf16 on a GPU that supports it; else none, on every CPU, bf16 units or not.
      Translation casts the weights themselves (`nmt.inference.checkpoints.load_model`), not
      autocast, and no CPU measurement of bf16 decoding is recorded, so `auto` keeps CPUs in
      fp32; `--amp bf16` asks for bf16 there.
    """
    if purpose not in AMP_PURPOSES:
        raise ValueError(f"purpose must be one of {AMP_PURPOSES}, not {purpose!r}")
    if amp != "auto":
        return amp
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "none"
    return "bf16" if purpose == "train" and device.type == "cpu" and cpu_bf16_units()[0] else "none"


def worker_processes(preload: str) -> multiprocessing.context.BaseContext:
    """The multiprocessing context that starts a command's local worker processes: forked from a
    fork server that imported `preload` (and the main script) once, instead of spawned processes
    that each start Python and import torch and nmt again, seconds of CPU per process. Safe with
    CUDA as spawn is: the server is a fresh interpreter that never touches a GPU, and the workers
    initialise CUDA themselves. Spawn where the platform has no fork server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", preload])
    return context
