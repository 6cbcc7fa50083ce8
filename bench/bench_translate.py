"""Translation speed: sentences/s, target tokens/s and peak RSS, with beam 4 and greedy, in
process; then the whole `nmt translate` command, start-up included; then CTranslate2 (fp32 and
int8 compute on the same exported fp32 weights) through `--engine ctranslate2`'s translator,
against nmt with the same search (`--beam-style fairseq --lenpen-style avg`) and threads, and
how many lines the two engines translate identically. Models: `--archs mini,small` (random
weights) or a trained RUN_DIR. Prints one JSON line last (also in bench/results/translate.json).
Every time is the best of --repeat runs (2), nmt's and CTranslate2's alike: a shared CPU only
ever slows a run down, and the whole command is compared with the in-process time.

Also the model FLOP/s as a fraction of the fp32 matmul FLOP/s measured here with the same
threads (a ratio that survives a noisy machine): model FLOPs = 2 x (encoder non-embedding
parameters + decoder encoder-key/value projections) x source tokens + 2 x (the rest of the
decoder + vocabulary x d_model) x decoder rows, one row per hypothesis per step.

    .venv/bin/python bench/bench_translate.py [RUN_DIR] [--limit N] [--threads 2]

RUN_DIR: a trained run directory (its checkpoint_avg/best/last.pt). Without one, the bench
builds a run in a temporary folder: a joint BPE vocabulary (--vocab-size, 8000) learned on
Multi30k train (en+de) and randomly initialised models (--archs, `mini` and `small`; small: 3+3 layers, d_model
256). Random weights almost never choose eos, so their outputs would run to the length limit
(source + 50); the bench then limits outputs to --max-len-a 1 --max-len-b 0, as long as their
sources, which is about a trained model's length on test_2016_flickr (German references: 14.3
subword tokens per line, English sources: 14.2). The numbers of a trained model differ: it
stops at eos, and its beam may run a few steps past the best hypothesis.

For the GPU check (the paper's `base`, newstest2014, bf16):
    python bench/bench_translate.py --archs base --device cuda --amp bf16 \\
        --source ../shared/data/wmt14/newstest2014.en.gz --threads 0 --max-tokens 16384 --no-cli --no-ct2
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_MULTI30K, REPO, matmul_flops, peak_rss_mib, write_result  # noqa: E402

sys.path.insert(0, str(REPO))


RANDOM_IDENTITY_NOTE = (" (random weights: every line ends at the length limit, where CTranslate2 ends with whatever"
                        " token comes and nmt forces eos; identity is checked with a trained RUN_DIR)")


def build_random_run(root: Path, multi30k: Path, arch: str, vocab_size: int) -> Path:
    """A run directory with a learned vocabulary and a random model, as preprocess + train leave it."""
    import torch

    from nmt.run.checkpoint import save_checkpoint
    from nmt.run.identity import IDENTITY_KEY, run_identity
    from nmt.model.transformer import Transformer
    from nmt.model.config import build_config
    from nmt.run.directory import RunDir
    from nmt.data.tokenizer import load_tokenizer, train_tokenizer

    lines = [l.rstrip("\n") for name in ("train.en.gz", "train.de.gz") for l in gzip.open(multi30k / name, "rt", encoding="utf-8")]
    model_file = train_tokenizer("bpe", lines, vocab_size, root / "vocab" / "joint.model")
    vocab = load_tokenizer(model_file).vocab_size
    rd = RunDir(root)
    rd.write_record("preprocess", {
        "source_lang": "en", "target_lang": "de", "vocab_type": "bpe", "joined": True,
        "vocab": {"en": "vocab/joint.model", "de": "vocab/joint.model"},
        "vocab_sizes": {"en": vocab, "de": vocab}, "dtype": "uint16", "moses": False, "splits": {},
    })
    torch.manual_seed(0)
    model = Transformer(build_config(arch, vocab, vocab))
    save_checkpoint(root / "checkpoints" / "checkpoint_last.pt",
                    {"model": model.state_dict(), "config": model.cfg.to_dict(), IDENTITY_KEY: run_identity(rd)})
    return root


def model_flops(model, source_tokens: int, decoder_rows: int) -> float:
    """Matrix-product FLOPs of one translation run (attention scores and softmax left out)."""
    enc = sum(p.numel() for p in model.encoder_layers.parameters())
    memory_kv = sum(layer.cross_attn.kv_proj.weight.numel() for layer in model.decoder_layers)
    dec = sum(p.numel() for p in model.decoder_layers.parameters()) - memory_kv
    out = model.cfg.tgt_vocab_size * model.cfg.d_model
    return 2.0 * ((enc + memory_kv) * source_tokens + (dec + out) * decoder_rows)


def time_ctranslate2(run: Path, lines: list[str], compute_type: str, args, length: dict) -> tuple[dict, list[str]]:
    """CTranslate2 sentences/s with nmt's tokenization and line handling around it; and its output lines."""
    from nmt.inference.translator import load_translator
    from nmt.inference.config import SearchConfig, TranslateConfig

    search = SearchConfig(beam=4, beam_style="fairseq", lenpen_style="avg", **length)
    cfg = TranslateConfig(device=args.device, threads=args.threads, max_tokens=args.max_tokens,
                          engine="ctranslate2", ct2_compute_type=compute_type)
    translator = load_translator(run, search=search, cfg=cfg)
    translator.translate(lines[:32])
    seconds = math.inf
    for _ in range(args.repeat):
        start = time.perf_counter()
        out = translator.translate(lines)
        seconds = min(seconds, time.perf_counter() - start)
    return {"seconds": round(seconds, 3), "sentences_per_s": round(len(lines) / seconds, 1)}, [t.hyp for t in out]


def time_in_process(run: Path, lines: list[str], beam: int, args, length: dict, **search_args) -> dict:
    from nmt.model.transformer import Transformer
    from nmt.inference.translator import load_translator
    from nmt.inference.config import SearchConfig, TranslateConfig

    search = SearchConfig(beam=beam, **length, **search_args)
    cfg = TranslateConfig(device=args.device, threads=args.threads, amp=args.amp, max_tokens=args.max_tokens)
    translator = load_translator(run, search=search, cfg=cfg)
    translator.translate(lines[:32])  # warm-up: allocator, GEMM kernels
    translator.target_tokens = 0

    rows = [0]
    decode_step = Transformer.decode_step_hidden

    def counting_step(self, tokens, state):  # one Python call per step: no measurable cost
        rows[0] += tokens.numel()
        return decode_step(self, tokens, state)

    Transformer.decode_step_hidden = counting_step
    try:
        seconds = math.inf
        for _ in range(args.repeat):  # the best of N: a shared CPU only ever slows a run down
            rows[0] = translator.target_tokens = 0
            start = time.perf_counter()
            out = translator.translate(lines)
            seconds = min(seconds, time.perf_counter() - start)
    finally:
        Transformer.decode_step_hidden = decode_step
    assert len(out) == len(lines)
    time_in_process.last_output = [t.hyp for t in out]
    source_tokens = sum(min(len(ids), translator.max_positions - 1) + 1
                        for ids in translator.src_tokenizer.encode(lines) if ids)
    flops = model_flops(translator.models[0], source_tokens, rows[0])
    return {
        "seconds": round(seconds, 3),
        "sentences_per_s": round(len(lines) / seconds, 1),
        "target_tokens_per_s": round(translator.target_tokens / seconds, 1),
        "target_tokens": translator.target_tokens,
        "decoder_rows": rows[0],
        "model_gflop_per_s": round(flops / seconds / 1e9, 1),
    }


def time_cli(run: Path, source: Path, n_lines: int, args, length: dict) -> dict:
    cmd = [sys.executable, "-m", "nmt_cli", "translate", "-r", str(run), "--input", str(source), "--quiet",
           "--threads", str(args.threads), "--device", args.device, "--amp", args.amp, "--max-tokens", str(args.max_tokens)]
    for key, value in length.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    # Peak RSS of this one command: GNU time when there is one (RUSAGE_CHILDREN is the max over all children).
    timer = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").is_file() else []
    seconds, peak_kib = math.inf, 0
    for _ in range(args.repeat):  # the best of N, as in-process
        start = time.perf_counter()
        proc = subprocess.run(timer + cmd, capture_output=True, cwd=REPO)
        seconds = min(seconds, time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"nmt translate failed: {proc.stderr.decode(errors='replace').strip()}")
        lines_out = proc.stdout.decode("utf-8").count("\n")
        peak_kib = max(peak_kib, int(proc.stderr.decode().split()[-1]) if timer else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return {"seconds": round(seconds, 2), "lines_in": n_lines, "lines_out": lines_out, "peak_rss_mib": round(peak_kib / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", type=Path, help="trained run directory (default: a random model, see above)")
    parser.add_argument("--data", type=Path, default=DEFAULT_MULTI30K, help="Multi30k folder")
    parser.add_argument("--source", type=Path, help="lines to translate (default: DATA/test_2016_flickr.en.gz)")
    parser.add_argument("--limit", type=int, default=0, help="translate only the first N lines (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None, help="default: nmt translate's")
    parser.add_argument("--beams", default="4,1", help="beam sizes to time, comma-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="auto")
    parser.add_argument("--archs", default="mini,small", help="architectures of the random models, comma-separated")
    parser.add_argument("--vocab-size", type=int, default=8000, help="vocabulary of the random model")
    parser.add_argument("--repeat", type=int, default=2,
                        help="time each nmt measurement N times and keep the fastest (peak RSS: the largest)")
    parser.add_argument("--no-cli", action="store_true", help="skip timing the whole command")
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    args = parser.parse_args()

    import torch

    from nmt.inference.config import TranslateConfig

    if args.max_tokens is None:
        args.max_tokens = TranslateConfig.max_tokens
    source = args.source or args.data / "test_2016_flickr.en.gz"
    if not source.is_file():
        raise SystemExit(f"no input at {source}; pass --data or --source")

    with tempfile.TemporaryDirectory(prefix="bench_translate.") as tmp:
        with gzip.open(source, "rt", encoding="utf-8") if source.suffix == ".gz" else open(source, encoding="utf-8") as f:
            lines = [l.rstrip("\n") for l in f]
        if args.limit:
            lines = lines[: args.limit]
        plain = Path(tmp) / "input.txt"
        plain.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
        result: dict = {"bench": "translate", "source": str(source), "sentences": len(lines), "threads": args.threads,
                        "device": args.device, "max_tokens": args.max_tokens, "models": {}}
        if args.run_dir is not None:
            models = [("trained", args.run_dir, "trained", {})]
        else:
            models = []
            for arch in args.archs.split(","):
                print(f"building a run with a random `{arch}` model and a {args.vocab_size}-piece vocabulary "
                      f"learned on {args.data}/train ...", file=sys.stderr)
                run = build_random_run(Path(tmp) / arch, args.data, arch, args.vocab_size)
                models.append((arch, run, "random", {"max_len_a": 1.0, "max_len_b": 0}))
        for label, run, weights, length in models:
            result["models"][label] = bench_model(label, run, weights, length, lines, plain, args)
        result["peak_rss_mib"] = round(peak_rss_mib(), 1)
        if args.device.startswith("cuda"):
            result["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        if args.device == "cpu":
            peak = matmul_flops() / 1e9
            result["matmul_gflop_per_s"] = round(peak, 1)
            for r in result["models"].values():
                for key in [k for k in r if k.startswith("beam")]:
                    r[key]["fraction_of_matmul"] = round(r[key]["model_gflop_per_s"] / peak, 3)
            print(f"fp32 matmul with {torch.get_num_threads()} threads: {peak:.1f} GFLOP/s", file=sys.stderr)
        print(f"peak RSS of this bench process: {result['peak_rss_mib']} MiB", file=sys.stderr)
        write_result("translate", result)
        print(json.dumps(result))


def bench_model(label: str, run: Path, weights: str, length: dict, lines: list[str], plain: Path, args) -> dict:
    """nmt (default search; beams), nmt fairseq/avg vs CTranslate2 fp32 and int8, the whole command."""
    result: dict = {"weights": weights, **({"length_limit": length} if length else {})}

    def say(text: str) -> None:
        print(f"[{label}, {weights} weights] {text}", file=sys.stderr, flush=True)

    for beam in [int(b) for b in args.beams.split(",")]:
        r = time_in_process(run, lines, beam, args, length)
        result[f"beam{beam}"] = r
        say(f"nmt beam {beam} (t2t): {r['sentences_per_s']} sentences/s, {r['target_tokens_per_s']} target tokens/s "
            f"({r['seconds']} s for {len(lines)} lines; model {r['model_gflop_per_s']} GFLOP/s)")
    if not args.no_ct2:
        from nmt.inference.checkpoints import default_checkpoint
        from nmt.run.directory import RunDir
        from nmt.inference.ctranslate2_engine import cached_model_dir

        cached_model_dir(RunDir(run), default_checkpoint(RunDir(run)))  # the export is not timed
        nmt_same = time_in_process(run, lines, 4, args, length, beam_style="fairseq", lenpen_style="avg")
        nmt_out = time_in_process.last_output
        result["beam4_fairseq_avg"] = nmt_same
        for compute_type in ("float32", "int8"):
            r, out = time_ctranslate2(run, lines, compute_type, args, length)
            r["ratio_nmt_over_ct2"] = round(nmt_same["sentences_per_s"] / r["sentences_per_s"], 3)
            r["identical_lines"] = sum(a == b for a, b in zip(nmt_out, out))
            result[f"ct2_{compute_type}"] = r
            say(f"CTranslate2 {compute_type}: {r['sentences_per_s']} sentences/s; nmt (fairseq/avg) "
                f"{nmt_same['sentences_per_s']} sentences/s = {r['ratio_nmt_over_ct2']}x; "
                f"{r['identical_lines']}/{len(lines)} lines identical{RANDOM_IDENTITY_NOTE if weights == 'random' else ''}")
    if not args.no_cli:
        c = time_cli(run, plain, len(lines), args, length)
        result["cli_beam4"] = c
        say(f"`nmt translate` beam 4, whole command: {c['seconds']} s, {c['lines_out']} lines out of "
            f"{c['lines_in']}, peak RSS {c['peak_rss_mib']} MiB")
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
