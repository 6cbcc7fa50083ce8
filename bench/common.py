"""Shared pieces of the benchmarks: the machine's matmul peak, peak memory, result files."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
DEFAULT_WMT14 = REPO.parent / "shared" / "data" / "wmt14"
RESULTS = REPO / "bench" / "results"


def read_lines(path: Path) -> list[str]:
    """The lines of a text file, gzip-compressed when its name ends in .gz, without their newlines."""
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def positive_ints(text: str) -> list[int]:
    """An argparse type for a comma-separated list of positive integers ("1024,4096"): a bad
    value ends in argparse's one-line usage error that names it, never a traceback."""
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers")
    return values


def positive_int(text: str) -> int:
    """An argparse type for one positive integer, with the same one-line error as `positive_ints`."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


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


def machine() -> tuple[str, str]:
    """(short name for a result file, description) of this CPU, from /proc/cpuinfo: the kinds
    the project measures on (AVX2-only EPYC, Zen 4 with AVX512-BF16, Sapphire Rapids with AMX)."""
    info = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").is_file() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines()[:40] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    name = fields.get("model name", "unknown CPU")
    cores = os.cpu_count()
    units = ", ".join(u for u, f in (("AVX-512", "avx512f"), ("AVX512-BF16", "avx512_bf16"), ("AMX-BF16", "amx_bf16")) if f in flags) or "AVX2 only"
    description = f"{name} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}): {units}; {cores} cores"
    if "amx_bf16" in flags:
        return "sapphire-rapids", description
    if "avx512_bf16" in flags and "AMD" in name:
        return "zen4", description
    if "AMD" in name:
        return "epyc-avx2", description
    return "machine-unknown", description


def unused_path(path: Path) -> Path:
    """`path`, or the first of path-2, path-3, ... (before the suffix) that does not exist yet:
    a second run of a bench on the same day and commit (another --max-tokens, a repeat) gets
    its own file instead of replacing the first one's."""
    candidate, n = path, 2
    while candidate.exists():
        candidate, n = path.with_name(f"{path.stem}-{n}{path.suffix}"), n + 1
    return candidate


def write_result(name: str, result: dict) -> Path:
    """bench/results/DATE_COMMIT_MACHINE_bench-NAME.json, with date, commit, machine and command
    in it: one file per row of bench/RESULTS.md, never overwriting an earlier measurement."""
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip() or "nocommit"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    slug, description = machine()
    date = time.strftime("%Y-%m-%d")
    record = {"date": date, "commit": commit + ("+changes" if dirty else ""), "machine": description,
              "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), **result}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = unused_path(RESULTS / f"{date}_{commit}_{slug}_bench-{name}.json")
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}", file=sys.stderr)
    return path
