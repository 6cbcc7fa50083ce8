"""Benchmark `nmt preprocess` binarization: pairs/s and peak memory on a 1M-pair corpus.

The corpus is Multi30k train (29,000 pairs) repeated to `--pairs` pairs, written as plain text
in a temporary folder. The vocabulary (joint BPE, 8000) is learned once beforehand and not
timed; the timed run is the real command line, `nmt preprocess --vocab ...`, end to end
(interpreter start, line counting, reading, encoding, writing), in a child process whose
whole process tree (parent + workers) is sampled for its resident memory.

Target (issue 2): at least 40,000 pairs/s on 2 cores, peak RSS under 1 GiB whatever the size
(compare --pairs 100000 with the default to see that memory does not grow with the corpus).

    python bench/bench_preprocess.py                 # 1M pairs
    python bench/bench_preprocess.py --pairs 100000  # quicker
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def build_corpus(multi30k: Path, out_prefix: Path, pairs: int, langs: tuple[str, str]) -> None:
    """Repeat Multi30k train until `pairs` lines, into plain-text OUT_PREFIX.{lang}."""
    for lang in langs:
        lines = gzip.open(multi30k / f"train.{lang}.gz", "rb").read().splitlines(keepends=True)
        repeats, rest = divmod(pairs, len(lines))
        block = b"".join(lines)
        with open(f"{out_prefix}.{lang}", "wb") as f:
            for _ in range(repeats):
                f.write(block)
            f.write(b"".join(lines[:rest]))


def learn_vocabulary(multi30k: Path, run_dir: Path, vocab_size: int, langs: tuple[str, str]) -> Path:
    """Learn the joint BPE vocabulary once, from the original Multi30k train (not timed)."""
    sys.path.insert(0, str(REPO))
    from nmt.preprocess.pipeline import PreprocessConfig, run_preprocess

    cfg = PreprocessConfig(source_lang=langs[0], target_lang=langs[1], trainpref=str(multi30k / "train"),
                           vocab_size=vocab_size, workers=1)
    # workers=1: no child processes here, so RUSAGE_CHILDREN later sees only the timed run.
    result = run_preprocess(run_dir, cfg, progress=False)
    return run_dir / result.record["vocab"][langs[0]]


def timed_binarization(prefix: Path, vocab: Path, run_dir: Path, workers: int, langs: tuple[str, str],
                       interval: float = 0.02) -> dict:
    """Run `nmt preprocess --vocab` in a child; wall time and peak RSS of its process tree."""
    cmd = [sys.executable, "-m", "nmt_cli", "preprocess", "-s", langs[0], "-t", langs[1], "--trainpref", str(prefix),
           "--vocab", str(vocab), "-r", str(run_dir), "--workers", str(workers)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    root = psutil.Process(proc.pid)
    peak_tree = 0
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
            rss = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            peak_tree = max(peak_tree, rss)
        except psutil.Error:
            pass
        time.sleep(interval)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode("utf-8", errors="replace")
    if proc.returncode != 0:
        sys.exit(f"nmt preprocess failed (exit {proc.returncode}):\n{stderr}")
    # Waited-for children: ru_maxrss is the largest single process (KiB on Linux); the CPU
    # seconds tell a busy machine (wall >> cpu / cores) from a slow program.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_tree_bytes": peak_tree,
            "peak_rss_max_process_bytes": usage.ru_maxrss * 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k",
                    help="Folder with Multi30k train.{en,de}.gz (default: ../shared/data/multi30k)")
    ap.add_argument("--pairs", type=int, default=1_000_000, help="Corpus size in pairs (default: 1,000,000)")
    ap.add_argument("--workers", type=int, default=0, help="--workers of nmt preprocess (default 0: all cores)")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--json-out", type=Path, default=None, help="Write the result JSON here (default: a new dated file in bench/results/)")
    args = ap.parse_args()
    langs = ("en", "de")
    if not (args.data / "train.en.gz").is_file():
        sys.exit(f"Multi30k not found in {args.data}; pass --data")

    tmp = Path(tempfile.mkdtemp(prefix="bench-preprocess-"))
    try:
        print(f"building {args.pairs:,} pairs in {tmp} ...", file=sys.stderr)
        build_corpus(args.data, tmp / "train", args.pairs, langs)
        print("learning the vocabulary (not timed) ...", file=sys.stderr)
        vocab = learn_vocabulary(args.data, tmp / "vocab-run", args.vocab_size, langs)
        print("timing nmt preprocess --vocab ...", file=sys.stderr)
        t = timed_binarization(tmp / "train", vocab, tmp / "run", args.workers, langs)
        record = json.loads((tmp / "run" / "config" / "preprocess.json").read_text())
        kept = record["splits"]["train"]["pairs"]
        if kept != args.pairs:
            sys.exit(f"expected {args.pairs} binarized pairs, got {kept}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    result = {
        "bench": "preprocess",
        "pairs": args.pairs,
        "workers": args.workers or len(os.sched_getaffinity(0)),
        "cpus": len(os.sched_getaffinity(0)),
        "wall_s": round(t["wall_s"], 3),
        "pairs_per_s": round(args.pairs / t["wall_s"]),
        "cpu_s": round(t["cpu_s"], 3),
        "pairs_per_cpu_s": round(args.pairs / t["cpu_s"]),
        "peak_rss_mib": round(t["peak_rss_tree_bytes"] / 2**20, 1),
        "peak_rss_max_process_mib": round(t["peak_rss_max_process_bytes"] / 2**20, 1),
        "target_pairs_per_s": 40000,
        "target_peak_rss_mib": 1024,
    }
    print(f"binarized {args.pairs:,} pairs in {result['wall_s']:.2f} s: {result['pairs_per_s']:,} pairs/s "
          f"(target >= 40,000; {result['cpu_s']:.1f} CPU s over {result['cpus']} cores); peak RSS {result['peak_rss_mib']:.0f} MiB summed over the process tree, "
          f"{result['peak_rss_max_process_mib']:.0f} MiB largest process (target < 1024 MiB)")
    print(json.dumps(result))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import write_result

        write_result("preprocess", result)


if __name__ == "__main__":
    main()
