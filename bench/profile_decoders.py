"""Where the decoders' time goes: nmt's native beam search and standalone CTranslate2, each
sampled by Linux `perf` while it translates the same lines, the samples grouped by what the
code does. #30 asks for the native decoder at 0.8x CTranslate2; this says which part of the
gap is arithmetic and which is the rest.

Each decoder runs in a process of its own with one thread by default (a clean attribution:
no thread pool, no second worker), beam 4 with `--beam-style fairseq --lenpen-style avg` (the
search CTranslate2 does), on a trained run and its CTranslate2 export (made if missing, as
`make bench-translate` does). `perf record -k CLOCK_MONOTONIC` samples the whole process;
only the samples inside the timed translate call count (each child prints that call's start
and end on CLOCK_MONOTONIC), so imports, loading and warm-up stay out. Categories, by symbol,
first match wins:

  matrix products  MKL / oneDNN / OpenBLAS kernels (sgemm, sgemv, packing)
  attention kernel PyTorch's fused CPU flash attention, and nmt's C++ decoder attention (the
                   nmt_ancestor_attention_* library of nmt/ops/ancestor_attention.py), products included
  softmax and exp  softmax, log-softmax and the exponentials inside them
  top-k and max    top-k selection and max reductions
  copies           memmove/memcpy, copy kernels, gathers, index_select, concatenation
  Python           the interpreter (libpython)
  OS kernel        page faults, scheduling, system calls
  the rest         everything else: PyTorch's dispatcher and operator set-up, element-wise
                   kernels (add, layer norm, ReLU, masks), allocation

    .venv/bin/python bench/profile_decoders.py RUN_DIR [RUN_DIR ...] [--threads 1] [--limit N]
    make bench-decoder-profile RUNS="runs/mini runs/small"

Needs `perf` (linux-tools) and permission to use it (kernel.perf_event_paranoid <= 2 for
one's own processes). Prints a table, writes bench/results/DATE_COMMIT_MACHINE_bench-decoder-profile.json
and prints it as one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_MULTI30K, REPO, read_lines, write_result  # noqa: E402

CATEGORIES = [
    ("matrix products", r"mkl_blas|sgemm|gemv|gemm|dnnl|brgemm|openblas"),
    ("attention kernel", r"flash_attention"),
    ("softmax and exp", r"softmax|Sleef_\w*exp|__ieee754_exp|\bexpf?\b|mkl_vml_kernel_sExp"),
    ("top-k and max", r"topk|TopK|introselect|adjust_heap|reduce|amax|max_values"),
    ("copies", r"memmove|memcpy|copy|index_select|gather|[Cc]oncat|cat_serial"),
]
PYTHON, KERNEL, REST = "Python", "OS kernel", "the rest"
SAMPLE = re.compile(r"^\s*(\d+\.\d+):\s+[0-9a-f]+\s+(.*)\s+\(([^()]*)\)\s*$")
"""A `perf script -F time,ip,sym,dso` line: time, address, symbol (C++ symbols hold parentheses), (library)."""


def categorize(symbol: str, dso: str) -> str:
    """The category of one sample, from its symbol and library (see the module docstring)."""
    if "kernel.kallsyms" in dso:
        return KERNEL
    if "nmt_ancestor_attention" in dso:  # the C++ loops compute their products themselves
        return "attention kernel"
    for name, pattern in CATEGORIES:
        if re.search(pattern, symbol):
            return name
    return PYTHON if "libpython" in dso else REST


def profile(cmd: list[str], frequency: int, work: Path) -> tuple[dict, Counter, int]:
    """Run `cmd` under perf; (the child's JSON line, samples per category inside its window, all samples)."""
    data = work / "perf.data"
    run = subprocess.run(["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-F", str(frequency), "-o", str(data), "--", *cmd],
                         capture_output=True, text=True, cwd=REPO)
    reports = [l for l in run.stdout.splitlines() if l.startswith("{")]
    if run.returncode != 0 or not reports:  # perf refused (perf_event_paranoid), or the decoder failed
        why = (run.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"{Path(cmd[1]).name} under perf record failed (exit {run.returncode}): {why}")
    child = json.loads(reports[-1])
    start, end = child["window_monotonic"]
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "time,ip,sym,dso"], capture_output=True, text=True)
    counts: Counter = Counter()
    total = 0
    for line in script.stdout.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        total += 1
        if start <= float(m.group(1)) <= end:
            counts[categorize(m.group(2), m.group(3))] += 1
    return child, counts, total


def nmt_child(run: Path, source: Path, threads: int) -> None:
    """Translate `source` once with nmt's native engine (after a warm-up) and print the call's window."""
    sys.path.insert(0, str(REPO))
    from nmt.inference.config import SearchConfig, TranslateConfig
    from nmt.inference.translator import freeze_loaded_objects, load_translator
    from nmt.ops.cpu_malloc import keep_freed_memory

    keep_freed_memory()  # as `nmt translate` does on a CPU
    lines = source.read_text(encoding="utf-8").splitlines()
    translator = load_translator(run, search=SearchConfig(beam=4, beam_style="fairseq", lenpen_style="avg"),
                                 cfg=TranslateConfig(device="cpu", threads=threads))
    freeze_loaded_objects()  # as `nmt translate` does once its models are loaded
    translator.translate(lines[:32])
    start, started = time.perf_counter(), time.monotonic()
    out = translator.translate(lines)
    seconds, window = time.perf_counter() - start, (started, time.monotonic())
    assert len(out) == len(lines)
    print(json.dumps({"translate_s": round(seconds, 3), "sentences_per_s": round(len(lines) / seconds, 1),
                      "window_monotonic": window}))


def profile_run(run: Path, model_dir: Path, plain: Path, work: Path, args: argparse.Namespace) -> dict:
    """Both decoders on one trained run: each one's translate time and its seconds by category."""
    commands = {
        "nmt_native": [sys.executable, str(Path(__file__).resolve()), str(run.resolve()), "--nmt-child", str(plain), str(args.threads)],
        "ctranslate2": [sys.executable, str(REPO / "bench" / "ct2_standalone.py"), str(model_dir), str(plain), str(work / "ct2.out"),
                        "--inter", "1", "--intra", str(args.threads), "--max-batch-tokens", str(args.ct2_batch_tokens)],
    }
    engines: dict = {}
    for name, cmd in commands.items():
        print(f"{run.name}: perf record of {name} ...", file=sys.stderr)
        child, counts, total = profile(cmd, args.frequency, work)
        inside, seconds = sum(counts.values()), child["translate_s"]
        if not inside:
            raise SystemExit(f"perf recorded no sample inside {name}'s translate call; raise --frequency or translate more lines")
        engines[name] = {
            "translate_s": seconds, "sentences_per_s": child["sentences_per_s"], "samples_in_window": inside,
            "samples_in_process": total,
            # each category's share of the window's samples, in seconds of the timed call
            "seconds": {cat: round(seconds * counts[cat] / inside, 3) for cat in [c for c, _ in CATEGORIES] + [PYTHON, KERNEL, REST]},
        }
    nmt, ct2 = engines["nmt_native"], engines["ctranslate2"]
    ratio = round(ct2["translate_s"] / nmt["translate_s"], 3)
    print(f"{run.name:18s} {'nmt native':>11s} {'CTranslate2':>12s} {'difference':>11s}  (seconds of the translate call)", file=sys.stderr)
    for cat in nmt["seconds"]:
        a, b = nmt["seconds"][cat], ct2["seconds"][cat]
        print(f"{cat:18s} {a:11.3f} {b:12.3f} {a - b:+11.3f}", file=sys.stderr)
    print(f"{'total':18s} {nmt['translate_s']:11.3f} {ct2['translate_s']:12.3f} {nmt['translate_s'] - ct2['translate_s']:+11.3f}"
          f"  (nmt = {ratio}x CTranslate2)", file=sys.stderr)
    return {"engines": engines, "speed_ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, nargs="+", help="trained run directories")
    parser.add_argument("--data", type=Path, default=DEFAULT_MULTI30K, help="Multi30k folder")
    parser.add_argument("--limit", type=int, default=0, help="translate only the first N lines of test_2016_flickr (0: all)")
    parser.add_argument("--threads", type=int, default=1, help="threads of each decoder (CTranslate2: 1 x N)")
    parser.add_argument("--ct2-batch-tokens", type=int, default=1024, help="CTranslate2's max_batch_size in tokens")
    parser.add_argument("--frequency", type=int, default=999, help="perf samples per second")
    parser.add_argument("--nmt-child", nargs=2, metavar=("SOURCE", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nmt_child:
        return nmt_child(args.run_dir[0], Path(args.nmt_child[0]), int(args.nmt_child[1]))
    if shutil.which("perf") is None:
        raise SystemExit("profile_decoders.py needs Linux `perf` (linux-tools) on PATH")
    missing = [run for run in args.run_dir if not run.is_dir()]
    if missing:
        raise SystemExit(f"no run directory at {missing[0]}")
    source = args.data / "test_2016_flickr.en.gz"
    if not source.is_file():
        raise SystemExit(f"no input at {source}; pass --data")

    from bench_translate import exported_model_dir

    result: dict = {"bench": "decoder-profile", "threads": args.threads, "beam": 4, "search": "fairseq/avg",
                    "perf_frequency": args.frequency, "ct2_batch_tokens": args.ct2_batch_tokens, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="profile_decoders.") as tmp:
        work = Path(tmp)
        lines = read_lines(source)
        lines = lines[: args.limit] if args.limit else lines
        plain = work / "input.txt"
        plain.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
        result["sentences"] = len(lines)
        for run in args.run_dir:
            result["runs"][run.resolve().name] = profile_run(run, exported_model_dir(run), plain, work, args)
    write_result("decoder-profile", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
