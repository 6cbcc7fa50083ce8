"""WMT-scale data path, simulated: 4.5M pairs through preprocessing, batching and the first update.

The corpus is newstest2013 + newstest2014 (6,003 En-De pairs) sampled with replacement to
`--pairs` pairs, so its sentence lengths have newstest's distribution exactly (WMT14's 4.5M
training pairs are not on these machines). The joint BPE vocabulary is learned from the two
newstest sets beforehand (not timed). Then, each printed:

1. `nmt preprocess --vocab ...` on the corpus: wall time, pairs/s, peak RSS of its process tree;
2. the first epoch's batch formation and shuffling (nmt.data.batching.make_batches) at --max-tokens;
3. per training process of `--distributed-world-size 2 --device cpu`, what the data path holds
   before any model exists (both sides' offsets and sizes, the epoch's batches, the first
   update's collated batches): peak RSS, measured in two spawned processes;
4. the real `nmt train --distributed-world-size 2 --device cpu --arch small`: seconds from the
   command's start to its first logged update, and each training process's peak RSS;
5. a `big` checkpoint (model, Adam moments, vocabulary --big-vocab) written with
   nmt.run.checkpoint.save_checkpoint: seconds and size.

Targets (issue 11): batch formation < 10 s for 4.5M pairs; < 2 GB per training process
before the model is built.

    python bench/bench_scale.py                   # 4.5M pairs (several minutes on 2 cores)
    python bench/bench_scale.py --pairs 200000    # quicker
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_preprocess import timed_binarization  # noqa: E402
from common import DEFAULT_WMT14, REPO, write_result  # noqa: E402

LANGS = ("en", "de")


def build_corpus(wmt14: Path, out_prefix: Path, pairs: int, seed: int = 0) -> dict:
    """Sample newstest2013+2014 pairs with replacement into plain-text OUT_PREFIX.{en,de}."""
    sides = {}
    for lang in LANGS:
        lines: list[bytes] = []
        for year in (2013, 2014):
            lines += gzip.open(wmt14 / f"newstest{year}.{lang}.gz", "rb").read().splitlines(keepends=True)
        sides[lang] = lines
    pick = np.random.default_rng(seed).integers(0, len(sides["en"]), pairs)
    words = {}
    for lang, lines in sides.items():
        with open(f"{out_prefix}.{lang}", "wb") as f:
            for block in range(0, pairs, 100_000):
                f.write(b"".join(lines[i] for i in pick[block : block + 100_000]))
        counts = np.array([len(line.split()) for line in lines])[pick]
        words[lang] = {"mean": round(float(counts.mean()), 2), "p50": int(np.median(counts)),
                       "p99": int(np.percentile(counts, 99)), "max": int(counts.max())}
    return words


def learn_vocabulary(wmt14: Path, tmp: Path, vocab_size: int) -> Path:
    """Joint BPE from the two newstest sets (not timed)."""
    from nmt.preprocess.pipeline import PreprocessConfig, run_preprocess

    for lang in LANGS:
        with open(tmp / f"newstest.{lang}", "wb") as f:
            for year in (2013, 2014):
                f.write(gzip.open(wmt14 / f"newstest{year}.{lang}.gz", "rb").read())
    cfg = PreprocessConfig(source_lang=LANGS[0], target_lang=LANGS[1], trainpref=str(tmp / "newstest"),
                           vocab_size=vocab_size, workers=1)
    result = run_preprocess(tmp / "vocab-run", cfg, progress=False)
    return tmp / "vocab-run" / result.record["vocab"][LANGS[0]]


def time_batch_formation(run_dir: Path, max_tokens: int) -> dict:
    """Load the binarized corpus as training does and form two epochs' batches."""
    from nmt.data.batching import make_batches, usable_indices
    from nmt.data.token_arrays import TokenArray

    prep = json.loads((run_dir / "config" / "preprocess.json").read_text())
    t = time.perf_counter()
    src = TokenArray(run_dir / "data", "train", LANGS[0], prep["dtype"])
    tgt = TokenArray(run_dir / "data", "train", LANGS[1], prep["dtype"])
    indices, _ = usable_indices(src.sizes, tgt.sizes, 1024)
    load_s = time.perf_counter() - t
    timings = []
    for epoch in (1, 2):
        t = time.perf_counter()
        batches = make_batches(src.sizes, tgt.sizes, indices, max_tokens, seed=1, epoch=epoch)
        timings.append(time.perf_counter() - t)
    return {"load_s": round(load_s, 3), "first_epoch_s": round(timings[0], 3), "second_epoch_s": round(timings[1], 3),
            "batches": len(batches), "pairs": int(len(indices))}


def _high_water_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the parent across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _data_path_rank(rank: int, world: int, run_dir: str, max_tokens: int, out: "mp.Queue") -> None:
    """What one training process's data path holds before the model: corpus, batches, first update."""
    import torch  # a training process has torch loaded, so its baseline is counted

    from nmt.data.batching import collate, make_batches, usable_indices
    from nmt.data.token_arrays import TokenArray

    base = _high_water_mib()
    prep = json.loads((Path(run_dir) / "config" / "preprocess.json").read_text())
    src = TokenArray(Path(run_dir) / "data", "train", LANGS[0], prep["dtype"])
    tgt = TokenArray(Path(run_dir) / "data", "train", LANGS[1], prep["dtype"])
    indices, _ = usable_indices(src.sizes, tgt.sizes, 1024)
    batches = make_batches(src.sizes, tgt.sizes, indices, max_tokens, seed=1, epoch=1)
    groups = [batches[i : i + world] for i in range(0, len(batches), world)]
    mine = [collate(src, tgt, ids) for ids in groups[0][rank::world]]
    torch.cat([b.src.flatten() for b in mine])
    out.put({"rank": rank, "torch_imported_mib": round(base, 1),
             "peak_rss_mib": round(_high_water_mib(), 1)})


def data_path_rss(run_dir: Path, max_tokens: int, world: int = 2) -> list[dict]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_data_path_rank, args=(r, world, str(run_dir), max_tokens, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sorted(results, key=lambda r: r["rank"])


def first_update(run_dir: Path, arch: str, max_tokens: int, world: int = 2, timeout_s: float = 900) -> dict:
    """Start real DDP training on CPU; time to the first logged update; per-process peak RSS."""
    log = run_dir / "logs" / "train.jsonl"
    cmd = [sys.executable, "-m", "nmt_cli", "train", "-r", str(run_dir), "--arch", arch, "--max-tokens", str(max_tokens),
           "--distributed-world-size", str(world), "--device", "cpu", "--max-update", "1", "--log-interval", "1",
           "--no-progress-bar"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, start_new_session=True)
    root = psutil.Process(proc.pid)
    peaks: dict[int, int] = {}
    seconds = None
    while proc.poll() is None and time.perf_counter() - start < timeout_s:
        try:
            for p in root.children(recursive=True):
                try:
                    peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        if seconds is None and log.is_file() and '"kind": "train"' in log.read_text():
            seconds = time.perf_counter() - start
            break
        time.sleep(0.05)
    if proc.poll() is None:  # the first update is what we time; the rest (validation, save) is not
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    elif seconds is None:
        sys.exit(f"nmt train failed (exit {proc.returncode}):\n{proc.stderr.read().decode(errors='replace')}")
    # the two largest children are the training processes (the others: resource tracker etc.)
    ranks = sorted(peaks.values(), reverse=True)[:world]
    return {"arch": arch, "seconds_to_first_update": round(seconds, 2) if seconds else None,
            "peak_rss_per_process_mib": [round(r / 2**20, 1) for r in ranks]}


def big_checkpoint_write(path: Path, vocab: int) -> dict:
    """A `big` model with Adam state, written the way training writes checkpoints."""
    import torch

    from nmt.run.checkpoint import save_checkpoint
    from nmt.model.transformer import Transformer
    from nmt.model.config import build_config

    cfg = build_config("big", vocab, vocab)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # creates the moments the checkpoint carries
    ckpt = {"version": 1, "model": model.state_dict(), "config": cfg.to_dict(), "optimizer": opt.state_dict()}
    t = time.perf_counter()
    save_checkpoint(path, ckpt)
    seconds = time.perf_counter() - t
    size = path.stat().st_size
    return {"vocab": vocab, "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "seconds": round(seconds, 2), "size_mib": round(size / 2**20, 1), "mib_per_s": round(size / 2**20 / seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wmt14", type=Path, default=DEFAULT_WMT14, help="Folder with newstest201{3,4}.{en,de}.gz")
    ap.add_argument("--pairs", type=int, default=4_500_000)
    ap.add_argument("--vocab-size", type=int, default=8000, help="Joint BPE learned from newstest (default 8000)")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--arch", default="small", help="Model of the first-update timing (default small)")
    ap.add_argument("--big-vocab", type=int, default=37000, help="Vocabulary of the big checkpoint (paper: ~37000)")
    ap.add_argument("--workers", type=int, default=0, help="--workers of nmt preprocess (0: all cores)")
    ap.add_argument("--tmp", type=Path, default=None, help="Work folder (default: a new temporary one, removed)")
    args = ap.parse_args()
    if not (args.wmt14 / "newstest2013.en.gz").is_file():
        sys.exit(f"newstest2013/2014 not found in {args.wmt14}; pass --wmt14")
    sys.path.insert(0, str(REPO))
    tmp = args.tmp or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    tmp.mkdir(parents=True, exist_ok=True)
    result: dict = {"bench": "scale", "pairs": args.pairs, "max_tokens": args.max_tokens, "cpus": len(os.sched_getaffinity(0))}
    try:
        print(f"building {args.pairs:,} pairs from newstest2013+2014 in {tmp} ...", flush=True)
        result["words_per_sentence"] = build_corpus(args.wmt14, tmp / "train", args.pairs)
        vocab = learn_vocabulary(args.wmt14, tmp, args.vocab_size)
        print(f"words per sentence: {result['words_per_sentence']}", flush=True)

        run = tmp / "run"
        t = timed_binarization(tmp / "train", vocab, run, args.workers, LANGS)
        for lang in LANGS:
            (tmp / f"train.{lang}").unlink()
        result["preprocess"] = {"wall_s": round(t["wall_s"], 2), "pairs_per_s": round(args.pairs / t["wall_s"]),
                                "peak_rss_tree_mib": round(t["peak_rss_tree_bytes"] / 2**20, 1)}
        print(f"1. preprocess (vocabulary given): {t['wall_s']:.1f} s, {args.pairs / t['wall_s']:,.0f} pairs/s, "
              f"peak RSS {t['peak_rss_tree_bytes'] / 2**20:.0f} MiB (process tree)", flush=True)

        b = time_batch_formation(run, args.max_tokens)
        result["batching"] = b
        print(f"2. batch formation + shuffle, epoch 1: {b['first_epoch_s']:.2f} s (target < 10 s; epoch 2 "
              f"{b['second_epoch_s']:.2f} s) -> {b['batches']:,} batches of <= {args.max_tokens} tokens from "
              f"{b['pairs']:,} pairs; loading both sides {b['load_s']:.2f} s", flush=True)

        rss = data_path_rss(run, args.max_tokens)
        result["data_path_rss"] = rss
        print("3. per training process before the model (world size 2): "
              + ", ".join(f"rank {r['rank']} {r['peak_rss_mib']:.0f} MiB (torch alone {r['torch_imported_mib']:.0f})" for r in rss)
              + " (target < 2048 MiB)", flush=True)

        f = first_update(run, args.arch, args.max_tokens)
        result["first_update"] = f
        print(f"4. nmt train --arch {args.arch} --distributed-world-size 2 --device cpu: first update logged after "
              f"{f['seconds_to_first_update']} s; peak RSS per training process "
              + ", ".join(f"{m:.0f}" for m in f["peak_rss_per_process_mib"]) + " MiB (model included)", flush=True)

        c = big_checkpoint_write(tmp / "big.pt", args.big_vocab)
        result["big_checkpoint"] = c
        print(f"5. big checkpoint ({c['parameters_m']}M parameters + Adam moments, vocabulary {c['vocab']}): "
              f"{c['size_mib']:.0f} MiB written in {c['seconds']:.2f} s ({c['mib_per_s']:.0f} MiB/s)", flush=True)
    finally:
        if args.tmp is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    print("wrote", write_result("scale", result))


if __name__ == "__main__":
    main()
