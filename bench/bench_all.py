"""`make bench`: run the preprocess, train and translate benchmarks one after another and write
one JSON (bench/results/DATE_COMMIT_MACHINE_bench-all.json) with their numbers and this machine's matmul FLOP/s, so
numbers from different machines compare as ratios.

    python bench/bench_all.py [--quick]

--quick runs each benchmark at a reduced size (fewer pairs, updates and lines) to check the
pipeline; the full sizes are those of the issues (1M pairs, 200 updates, 1000 sentences).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, matmul_flops, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent


def cpu_description() -> dict:
    info = {"machine": platform.machine(), "processor": platform.processor()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "")
        flags = next((l.split(":", 1)[1].split() for l in text.splitlines() if l.startswith("flags")), [])
        info["model"] = model
        info["simd"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return info


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    py = sys.executable
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.time()
    run([py, str(HERE / "bench_preprocess.py")] + (["--pairs", "100000"] if args.quick else []))
    run([py, str(HERE / "bench_train.py"), "--threads", str(args.threads)] + (["--updates", "10"] if args.quick else []))
    run([py, str(HERE / "bench_translate.py"), "--threads", str(args.threads)] + (["--limit", "100"] if args.quick else []))
    import torch

    torch.set_num_threads(args.threads)
    summary = {
        "machine": cpu_description(),
        "threads": args.threads,
        "torch": torch.__version__,
        "matmul_flops_per_s": {"fp32": matmul_flops(torch.float32), "bf16": matmul_flops(torch.bfloat16)},
        "quick": args.quick,
    }
    for name in ("preprocess", "train", "translate"):
        written = [p for p in RESULTS.glob(f"*_bench-{name}.json") if p.stat().st_mtime >= started]
        summary[name] = json.loads(max(written, key=lambda p: p.stat().st_mtime).read_text()) if written else None
    out = write_result("all", summary)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("preprocess", "train", "translate")}, indent=2))
    print("wrote", out)


if __name__ == "__main__":
    main()
