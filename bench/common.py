"""Shared pieces of the benchmarks: the machine's matmul peak, peak memory, result files."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
DEFAULT_WMT14 = REPO.parent / "shared" / "data" / "wmt14"
RESULTS = REPO / "bench" / "results"


def matmul_flops(dtype: torch.dtype = torch.float32, n: int = 2048, budget_s: float = 3.0, device: str = "cpu") -> float:
    """Best FLOP/s of an n x n x n matrix product with PyTorch's current thread count.

    Repeats for about `budget_s` seconds (a dtype without hardware support, e.g. bf16 on an
    AVX2-only CPU, is measured on a smaller product so it still finishes quickly). On a GPU the
    product is 8192^3 on random data (TF32 off for fp32, as in training), timed between
    synchronisations after three warm-ups: the ceiling an MFU is measured against.
    """
    if device != "cpu":
        return _device_matmul_flops(dtype, torch.device(device))
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    t = time.perf_counter()
    a @ b
    first = time.perf_counter() - t
    if first > budget_s / 2 and n > 256:
        return matmul_flops(dtype, n // 2, budget_s)
    best, spent = first, first
    while spent < budget_s:
        t = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t
        best, spent = min(best, dt), spent + dt
    return 2 * n**3 / best


def _device_matmul_flops(dtype: torch.dtype, device: torch.device, n: int = 8192, repeats: int = 10) -> float:
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
