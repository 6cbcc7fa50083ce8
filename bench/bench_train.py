"""Training throughput: `--arch small` on Multi30k, 200 updates at --max-tokens 4096, 2 threads;
or any arch on a GPU (`make bench-train-gpu`: `big`, bf16, the paper's 25k-token batch).

Prints target tokens/s, source+target tokens/s, peak RSS, and model FLOP/s as a fraction of
the fp32 matmul FLOP/s measured by this same script (a ratio that survives noisy machines).
Model FLOPs per update = 6 x (non-embedding encoder parameters x source tokens +
(non-embedding decoder parameters + vocabulary x d_model) x target tokens), padding excluded.
Each precision runs in its own process so peak RSS is its own. Batches come through the
training loop's BatchStream (collated ahead by a thread; pinned memory on a GPU).

On a GPU (`--device cuda`) the ceiling is the GPU's own 8192^3 matrix product in the run's
precision, measured by this script, so the ratio printed is the MFU (model FLOPs utilisation);
the first 5 updates warm up (allocator, kernel choice) and are not timed. `--data newstest`
trains on newstest2013+2014 (WMT14 En-De's dev and test sets, the only WMT text on these
machines) with a joint BPE of `--vocab-size` pieces (default 32000, near the paper's 37000), so
the vocabulary projection and sentence lengths are WMT-like.

Targets (issue 11), printed with the results: fp32 >= 0.65 of the fp32 matmul peak; fp32 peak
RSS <= 1.2 GB; bf16 peak RSS no higher than fp32's; on a CPU with bf16 matrix units
(AVX512-BF16 or AMX), bf16 >= 1.7x fp32 target tokens/s. Where the CPU has no such units,
bf16 is skipped, and the bench says so: its matrix products would be emulated.

    python bench/bench_train.py [--updates 200] [--amp none bf16] [--run-dir DIR]
    python bench/bench_train.py --device cuda --arch big --max-tokens 25000 --amp bf16 --data newstest
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_MULTI30K, DEFAULT_WMT14, REPO, matmul_flops, peak_rss_mib, write_result  # noqa: E402

sys.path.insert(0, str(REPO))
from nmt.device import cpu_bf16_units  # noqa: E402


def prepare(run_dir: Path, data: str, multi30k: Path, wmt14: Path, vocab_size: int) -> None:
    """Preprocess the training data into `run_dir` once (later runs reuse it)."""
    if (run_dir / "config/preprocess.json").is_file():
        return
    if data == "newstest":
        if not (wmt14 / "newstest2014.en.gz").is_file():
            sys.exit(f"newstest2013/2014 (.en.gz, .de.gz) not found in {wmt14}; pass --wmt14 DIR")
        from bench_scale import learn_vocabulary

        with tempfile.TemporaryDirectory(prefix="bench-train-newstest-") as tmp:
            learn_vocabulary(wmt14, Path(tmp), vocab_size)  # a run dir whose training data is newstest
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(Path(tmp) / "vocab-run", run_dir)
        return
    if not (multi30k / "train.en.gz").is_file():
        sys.exit(f"Multi30k (train/val .en.gz, .de.gz) not found in {multi30k}; pass --multi30k DIR")
    subprocess.run([sys.executable, "-m", "nmt_cli", "preprocess", "-r", str(run_dir), "-s", "en", "-t", "de",
                    "--trainpref", str(multi30k / "train"), "--validpref", str(multi30k / "val"),
                    "--vocab-size", str(vocab_size)], check=True)


def measure(run_dir: Path, arch: str, amp: str, updates: int, max_tokens: int, threads: int, device: str) -> dict:
    """Train `updates` updates in this process; time the training steps only."""
    import torch

    from nmt.data.batch_stream import BatchStream
    from nmt.device import resolve_device
    from nmt.train.distributed import DistContext
    from nmt.model.transformer import non_embedding_parameters
    from nmt.train.loop import Trainer
    from nmt.train.config import ModelSettings, TrainConfig

    torch.set_num_threads(threads)
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    for sub in ("config", "vocab", "data"):
        shutil.copytree(run_dir / sub, work / sub)
    cfg = TrainConfig(model=ModelSettings(arch=arch), amp=amp, max_tokens=max_tokens, threads=threads, device=device,
                      progress_bar=False, save_interval_minutes=0, max_update=updates, log_interval=10**9)
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
    trainer = Trainer(work, cfg, DistContext(0, 1, 0, dev))
    enc, dec = non_embedding_parameters(trainer.model)
    vocab_proj = trainer.model_cfg.tgt_vocab_size * trainer.model_cfg.d_model
    groups = []
    epoch = 1
    while len(groups) < updates + 5:
        groups += trainer.epoch_groups(epoch)
        epoch += 1
    src_tok = tgt_tok = flops = 0.0
    losses = []
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    # A GPU's warm-up is not timed.
    warmup = 5 if dev.type == "cuda" else 0
    d = trainer.train_data
    with BatchStream(d.src, d.tgt, groups[: warmup + updates], device=dev, collate_fn=trainer.collate) as stream:
        for _ in range(warmup):
            trainer.train_step(next(stream))
        sync()
        start = time.perf_counter()
        for prepared in stream:
            out = trainer.train_step(prepared)
            if out is None:
                continue  # a skipped (non-finite) update: no tokens trained
            src_tok += out["src_tokens"]
            tgt_tok += out["ntokens"]
            flops += 6 * (enc * out["src_tokens"] + (dec + vocab_proj) * out["ntokens"])
            losses.append(out["loss_sum"] / out["ntokens"] / 0.6931471805599453)
        sync()
        elapsed = time.perf_counter() - start
    shutil.rmtree(work, ignore_errors=True)
    return {"arch": arch, "amp": amp, "updates": updates, "seconds": round(elapsed, 2),
            "tgt_tokens_per_s": round(tgt_tok / elapsed, 1), "src_tgt_tokens_per_s": round((src_tok + tgt_tok) / elapsed, 1),
            "model_flops_per_s": flops / elapsed, "peak_rss_mib": round(peak_rss_mib(), 1),
            "loss_first10": round(sum(losses[:10]) / len(losses[:10]), 4), "loss_last10": round(sum(losses[-10:]) / len(losses[-10:]), 4),
            "loss_curve": [round(x, 4) for x in losses],
            **({"gpu": torch.cuda.get_device_name(), "gpu_peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20)}
               if dev.type == "cuda" else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, default=None,
                    help="Preprocessed data (default runs/bench-multi30k or runs/bench-newstest-VOCAB, made once; runs/ is git-ignored)")
    ap.add_argument("--data", choices=["multi30k", "newstest"], default="multi30k")
    ap.add_argument("--multi30k", type=Path, default=DEFAULT_MULTI30K)
    ap.add_argument("--wmt14", type=Path, default=DEFAULT_WMT14)
    ap.add_argument("--vocab-size", type=int, default=None, help="Joint BPE pieces (default 8000 multi30k, 32000 newstest)")
    ap.add_argument("--arch", default="small")
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", nargs="+", default=["none", "bf16"])
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one precision in this process
    args = ap.parse_args()
    vocab_size = args.vocab_size or (32000 if args.data == "newstest" else 8000)
    run_dir = args.run_dir or REPO / "runs" / ("bench-multi30k" if args.data == "multi30k" else f"bench-newstest-{vocab_size}")
    if args.one:
        print(json.dumps(measure(run_dir, args.arch, args.one, args.updates, args.max_tokens, args.threads, args.device)))
        return
    prepare(run_dir, args.data, args.multi30k, args.wmt14, vocab_size)
    import torch

    torch.set_num_threads(args.threads)
    gpu = args.device != "cpu"
    native_bf16, evidence = (torch.cuda.is_bf16_supported(), torch.cuda.get_device_name()) if gpu else cpu_bf16_units()
    peaks = {"fp32": matmul_flops(torch.float32, device=args.device)}
    if "bf16" in args.amp and native_bf16:
        peaks["bf16"] = matmul_flops(torch.bfloat16, device=args.device)
    results = {}
    print(f"bf16 matrix units: {'yes' if native_bf16 else 'no'} ({evidence})", flush=True)
    for amp in args.amp:
        if amp == "bf16" and not native_bf16:
            print(f"skipping bf16: {evidence}", flush=True)
            continue
        cmd = [sys.executable, __file__, "--one", amp, "--run-dir", str(run_dir), "--arch", args.arch,
               "--updates", str(args.updates), "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
               "--device", args.device]
        key = amp
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:  # say why, and go on with the other runs
            print(f"train {args.arch} amp={key} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["fraction_of_fp32_matmul_peak"] = round(r["model_flops_per_s"] / peaks["fp32"], 3)
        own_peak = peaks["bf16" if amp == "bf16" else "fp32"]
        r["mfu"] = round(r["model_flops_per_s"] / own_peak, 3)  # against the matmul peak of the run's own precision
        results[key] = r
        print(f"train {args.arch} amp={key}: {r['tgt_tokens_per_s']:.0f} target tok/s, "
              f"{r['src_tgt_tokens_per_s']:.0f} src+tgt tok/s, model {r['model_flops_per_s'] / 1e9:.1f} GFLOP/s = "
              f"{r['fraction_of_fp32_matmul_peak']:.2f} x fp32 matmul peak"
              + (f" = MFU {r['mfu']:.3f} of the measured {'bf16' if amp == 'bf16' else 'fp32'} peak, "
                 f"GPU memory peak {r['gpu_peak_allocated_mib']} MiB" if gpu else "")
              + f", peak RSS {r['peak_rss_mib']:.0f} MiB, "
              f"loss {r['loss_first10']:.3f} -> {r['loss_last10']:.3f} (bits/token)", flush=True)
    summary = {"benchmark": "train", "matmul_flops_per_s": peaks, "threads": args.threads, "results": results,
               "flop_count": "6 x (enc non-embedding params x src tokens + (dec non-embedding params + V x d_model) x tgt tokens), padding excluded"}
    summary["native_bf16"] = bool(native_bf16)
    if gpu and "bf16" in results:
        print(f"targets: GPU bf16 MFU {results['bf16']['mfu']:.3f} (>= 0.40)")
    summary["bf16_units"] = evidence
    if "none" in results:
        fp32 = results["none"]
        print(f"targets: fp32 {fp32['fraction_of_fp32_matmul_peak']:.2f} x peak (>= 0.65), fp32 peak RSS "
              f"{fp32['peak_rss_mib'] / 1024:.2f} GiB (<= 1.2 GB = {1.2e9 / 2**30:.2f} GiB)")
    if "none" in results and "bf16" in results:
        summary["bf16_speedup"] = round(results["bf16"]["tgt_tokens_per_s"] / results["none"]["tgt_tokens_per_s"], 3)
        print(f"targets: bf16 peak RSS {results['bf16']['peak_rss_mib']:.0f} MiB (<= fp32's {results['none']['peak_rss_mib']:.0f}), "
              f"bf16 / fp32 {summary['bf16_speedup']:.2f}x (>= 1.7x)")
        n = len(results["bf16"]["loss_curve"])
        diffs = [abs(a - b) for a, b in zip(results["bf16"]["loss_curve"], results["none"]["loss_curve"][:n])]
        summary["bf16_vs_fp32_max_loss_difference_first_updates"] = round(max(diffs), 4)
        print(f"bf16 / fp32 target tokens/s: {summary['bf16_speedup']:.2f}x; largest per-update loss difference over "
              f"the first {n} updates: {summary['bf16_vs_fp32_max_loss_difference_first_updates']:.4f} bits")
    print(f"fp32 matmul peak {peaks['fp32'] / 1e9:.1f} GFLOP/s" + (f", bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s" if "bf16" in peaks else ""))
    summary.update(device=args.device, arch=args.arch, max_tokens=args.max_tokens, data=args.data, vocab_size=vocab_size)
    print("wrote", write_result("train" if not gpu else "train_gpu", summary))


if __name__ == "__main__":
    main()
