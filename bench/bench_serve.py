"""Load test of `nmt serve` on loopback, against `nmt translate`'s engine on the same lines.

    .venv/bin/python bench/bench_serve.py [RUN_DIR] [--clients 1,8,32] [--seconds 20] [--engines nmt,ctranslate2]

RUN_DIR: a trained run; default the Multi30k recipe's runs/multi30k-en-de when it has a
checkpoint, else a run with a random `small` model and a BPE vocabulary learned on Multi30k
train (bench_translate.py's; outputs then limited to the source length, see there).

1. The ceiling: sentences/s of the `nmt translate` command (its own summary line, which counts
   translating only, not loading) on the Multi30k test lines, with the same threads
   and settings as the server, in a fresh process; measured before and after the server's
   levels, and averaged, as the machine may be shared.
2. The server: `nmt serve` in a subprocess; for each client count, that many clients send the
   test lines (--lines-per-request each, one request after another on a kept-alive
   connection) for --seconds, after a short warm-up. Prints requests/s, sentences/s, latency
   p50/p95/p99 and errors per level, and the server's model calls (from /info).
3. A screenshot of the page at `/` after typing a sentence and clicking translate, in headless
   Chromium, to bench/results/serve_page.png (skipped, with the reason, without Chromium).

Steps 1 and 2 run once per engine (--engines), both with --search (default `--beam-style
fairseq --lenpen-style avg`, the one search CTranslate2 has, so both engines do the same work):
nmt's own decoder, then `--engine ctranslate2` on the run's CTranslate2 export (made by a one-line `nmt translate` before any
timing; trained runs only, as a random model's outputs run to the limit). Results go to
bench/results/DATE_COMMIT_MACHINE_bench-serve.json. The machine may be shared: compare the
ratios of one run (server / ceiling), not absolute numbers across runs. On a busy machine the wall-clock
ratio favours the server (its process has more threads, and Linux shares the CPU per thread),
so the bench also gives sentences per CPU-second of the server process and of the ceiling.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_MULTI30K, REPO, RESULTS, write_result  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

RECIPE_RUN = REPO / "runs" / "multi30k-en-de"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def length_flags(settings: dict) -> list[str]:
    """--max-len-a/-b of a random model's run (its outputs limited to the source length)."""
    return [flag for key in ("max_len_a", "max_len_b") if key in settings
            for flag in (f"--{key.replace('_', '-')}", str(settings[key]))]


def ceiling(run: Path, source: Path, settings: dict, engine: str) -> dict:
    """Sentences/s of the `nmt translate --engine ENGINE` command on `source`, in a fresh process
    (model loading included in its own timing; Python start-up not), and its sentences per CPU-second."""
    cmd = [sys.executable, "-m", "nmt_cli", "translate", "-r", str(run), "--input", str(source), "--device", "cpu",
           "--threads", str(settings["threads"]), "--engine", engine, *settings["search"]]
    cmd += length_flags(settings)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, cwd=REPO, env={**os.environ, "NMT_RUN_DIR": ""})
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"nmt translate failed: {proc.stderr.decode(errors='replace').strip()}")
    summary = re.search(r"(\d+) lines, \d+ target tokens in ([\d.]+) s", proc.stderr.decode())
    if summary is None:
        raise SystemExit(f"no summary line from nmt translate: {proc.stderr.decode(errors='replace')[-500:]}")
    n, seconds = int(summary.group(1)), float(summary.group(2))
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    return {"sentences": n, "seconds": seconds, "sentences_per_s": round(n / seconds, 1),
            "cpu_seconds": round(cpu, 2), "sentences_per_cpu_s": round(n / cpu, 2)}


def load_level(port: int, lines: list[str], clients: int, per_request: int, seconds: float, warmup: float) -> dict:
    """`clients` threads posting requests for `seconds`; latencies of requests that started after the warm-up."""
    requests = [lines[i:i + per_request] for i in range(0, len(lines), per_request)]
    t0 = time.perf_counter()
    measure_from, stop_at = t0 + warmup, t0 + warmup + seconds
    latencies: list[list[float]] = [[] for _ in range(clients)]
    sentences = [0] * clients
    all_sentences = [0] * clients  # warm-up included, for sentences per CPU-second of the server
    errors = [0] * clients

    def client(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        k = c
        while (start := time.perf_counter()) < stop_at:
            body = json.dumps({"text": requests[k % len(requests)]}).encode()
            try:
                conn.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                answer = json.loads(response.read())
                ok = response.status == 200 and len(answer["translations"]) == len(requests[k % len(requests)])
            except (OSError, http.client.HTTPException, ValueError):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            end = time.perf_counter()
            all_sentences[c] += len(requests[k % len(requests)]) if ok else 0
            if start >= measure_from and end <= stop_at:
                if ok:
                    latencies[c].append(end - start)
                    sentences[c] += len(requests[k % len(requests)])
                else:
                    errors[c] += 1
            k += clients
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return {
        "clients": clients,
        "requests": len(flat),
        "errors": sum(errors),
        "requests_per_s": round(len(flat) / seconds, 1),
        "sentences_per_s": round(sum(sentences) / seconds, 1),
        "latency_ms": {name: round(percentile(flat, q) * 1000, 1) for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "mean_latency_ms": round(statistics.fmean(flat) * 1000, 1) if flat else 0.0,
        "all_sentences": sum(all_sentences),
    }


def skip_engine(engine: str, weights: str) -> str:
    """Why `engine` is not measured here, or '' when it is."""
    if engine not in ("nmt", "ctranslate2"):
        raise SystemExit(f"unknown engine {engine!r} in --engines; choose nmt and/or ctranslate2")
    if engine == "ctranslate2":
        if weights != "trained":
            return "needs a trained run (a random model's outputs run to the length limit)"
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            return "ctranslate2 is not installed (pip install -e '.[ct2]')"
    return ""


def export_first(run: Path, tmp: Path, settings: dict) -> None:
    """Make the run's CTranslate2 export with a one-line `nmt translate`, so no timing includes it."""
    one = tmp / "one.en"
    one.write_text("A dog.\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "nmt_cli", "translate", "-r", str(run), "--input", str(one),
                           "--engine", "ctranslate2", "--threads", str(settings["threads"]), *settings["search"]],
                          capture_output=True, cwd=REPO, env={**os.environ, "NMT_RUN_DIR": ""})
    if proc.returncode != 0:
        raise SystemExit(f"nmt translate --engine ctranslate2 failed: {proc.stderr.decode(errors='replace').strip()}")


def measure_engine(engine: str, run: Path, lines: list[str], source_file: Path, settings: dict,
                   args: argparse.Namespace, tmp: Path) -> dict:
    """Steps 1-3 of the module docstring for one engine: the ceiling before, the server's
    levels (and, for nmt's engine, the page), the ceiling after, and the ratios."""
    from serve_helpers import Server, find_or_install_chromium, translate_in_page

    first = ceiling(run, source_file, settings, engine)
    print(f"[{engine}] nmt translate: {first['sentences_per_s']} sentences/s ({first['sentences']} lines in "
          f"{first['seconds']} s)", file=sys.stderr)
    flags = ["--threads", str(settings["threads"]), "--device", "cpu", "--engine", engine, *settings["search"]]
    flags += length_flags(settings)
    server = Server(run, *flags, *args.server_args.split(), log_dir=tmp)
    levels = []
    page = None
    try:
        info = server.get("/info")
        for clients in [int(c) for c in args.clients.split(",")]:
            before = server.get("/info")["stats"]
            cpu_before = sum(psutil.Process(server.proc.pid).cpu_times()[:2])
            level = load_level(server.port, lines, clients, args.lines_per_request, args.seconds, args.warmup)
            cpu = sum(psutil.Process(server.proc.pid).cpu_times()[:2]) - cpu_before
            level["server_cpu_seconds"] = round(cpu, 2)
            level["sentences_per_cpu_s"] = round(level.pop("all_sentences") / cpu, 2)
            after = server.get("/info")["stats"]
            calls = after["batches"] - before["batches"]
            level["model_calls"] = calls
            level["sentences_per_model_call"] = round((after["sentences"] - before["sentences"]) / max(calls, 1), 1)
            level["model_busy_fraction"] = round((after["busy_seconds"] - before["busy_seconds"]) / (args.seconds + args.warmup), 3)
            levels.append(level)
            lat = level["latency_ms"]
            print(f"[{engine}] {clients:3d} clients: {level['requests_per_s']} requests/s, {level['sentences_per_s']} "
                  f"sentences/s, latency p50 {lat['p50']} ms, p95 {lat['p95']} ms, p99 {lat['p99']} ms, "
                  f"{level['errors']} errors, {level['sentences_per_model_call']} sentences per model call, model busy "
                  f"{level['model_busy_fraction']:.0%} of the time", file=sys.stderr)
        if not args.no_page and engine == "nmt":
            chromium, why = find_or_install_chromium()
            if chromium is None:
                print(f"no page screenshot: {why}", file=sys.stderr)
            else:
                shot = RESULTS / "serve_page.png"
                shown = translate_in_page(server.url + "/", lines[0], chromium, screenshot=shot)
                page = {"screenshot": str(shot.relative_to(REPO)), "typed": lines[0], **shown}
                print(f"page: typed {lines[0]!r}, shown {shown['output']!r} in {shown['time']}; screenshot {shot}",
                      file=sys.stderr)
    finally:
        code = server.terminate()
    if code != 0:
        raise SystemExit(f"nmt serve --engine {engine} exited with {code}:\n{server.output()}")
    # The CPU may be shared: the ceiling is the mean of one measurement before and one after the levels.
    second = ceiling(run, source_file, settings, engine)
    top = {"sentences_per_s": round((first["sentences_per_s"] + second["sentences_per_s"]) / 2, 1),
           "sentences_per_cpu_s": round((first["sentences_per_cpu_s"] + second["sentences_per_cpu_s"]) / 2, 2),
           "before": first, "after": second}
    print(f"[{engine}] nmt translate, again: {second['sentences_per_s']} sentences/s; ceiling (mean) "
          f"{top['sentences_per_s']} sentences/s, {top['sentences_per_cpu_s']} sentences per CPU-second", file=sys.stderr)
    for level in levels:
        level["fraction_of_translate"] = round(level["sentences_per_s"] / top["sentences_per_s"], 3)
        level["cpu_fraction_of_translate"] = round(level["sentences_per_cpu_s"] / top["sentences_per_cpu_s"], 3)
        print(f"[{engine}] {level['clients']:3d} clients: {level['fraction_of_translate']:.0%} of nmt translate's "
              f"sentences/s, {level['cpu_fraction_of_translate']:.0%} of its sentences per CPU-second", file=sys.stderr)
    return {"info": {"arch": info.get("arch"), "parameters": info.get("parameters"), "settings": info.get("settings")},
            "translate_ceiling": top, "levels": levels, "page": page}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", type=Path, help="trained run (default: the recipe's, else a random `small` model)")
    parser.add_argument("--data", type=Path, default=DEFAULT_MULTI30K, help="Multi30k folder")
    parser.add_argument("--clients", default="1,8,32", help="concurrent clients per level, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds per level before measuring")
    parser.add_argument("--lines-per-request", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--server-args", default="", help="more `nmt serve` flags, e.g. '--batch-window-ms 2'")
    parser.add_argument("--no-page", action="store_true", help="skip the Chromium screenshot")
    parser.add_argument("--engines", default="nmt,ctranslate2", help="engines to measure, comma-separated")
    parser.add_argument("--search", default="--beam-style fairseq --lenpen-style avg",
                        help="search flags for the command and the server (CTranslate2 has only the default's search)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from bench_translate import build_random_run

    source = args.data / "test_2016_flickr.en.gz"
    if not source.is_file():
        raise SystemExit(f"no Multi30k test lines at {source}; pass --data")
    lines = [l.rstrip("\n") for l in gzip.open(source, "rt", encoding="utf-8")]

    with tempfile.TemporaryDirectory(prefix="bench_serve.") as tmp:
        run = args.run_dir
        if run is None and any((RECIPE_RUN / "checkpoints").glob("checkpoint*.pt")):
            run = RECIPE_RUN
        if run is not None:
            weights, length = "trained", {}
        else:
            print("no trained run: building one with a random `small` model ...", file=sys.stderr)
            run = build_random_run(Path(tmp), args.data, "small", 8000)
            weights, length = "random", {"max_len_a": 1.0, "max_len_b": 0}
        settings = {"threads": args.threads, "search": args.search.split(), **length}

        load_before = os.getloadavg()[0]
        source_file = Path(tmp) / "lines.en"
        source_file.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
        engines = {}
        for engine in args.engines.split(","):
            why = skip_engine(engine, weights)
            if why:
                print(f"engine {engine}: skipped, {why}", file=sys.stderr)
                engines[engine] = {"skipped": why}
                continue
            if engine == "ctranslate2":
                export_first(run, Path(tmp), settings)
            engines[engine] = measure_engine(engine, run, lines, source_file, settings, args, Path(tmp))

    result = {"bench": "serve", "weights": weights, "run": str(args.run_dir or (RECIPE_RUN if weights == "trained" else "random small")),
              "source": str(source), "lines_per_request": args.lines_per_request, "threads": args.threads,
              "search": args.search,
              "seconds_per_level": args.seconds, **({"length_limit": length} if length else {}),
              "engines": engines, "load_average_1min": {"start": load_before, "end": os.getloadavg()[0]}}
    write_result("serve", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
