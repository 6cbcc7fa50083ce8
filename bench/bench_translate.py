"""Translation speed: nmt's decoder against CTranslate2 run as its own users run it.

For each model: nmt's sentences/s and target tokens/s in process (beam 4 with the paper's
`t2t` search, greedy, and beam 4 `--beam-style fairseq --lenpen-style avg`, the search
CTranslate2 does); then, for a trained model, CTranslate2 in processes of its own that never
import torch (bench/ct2_standalone.py: one `translate_batch` over all lines, sorted token-based
batches of each size in --ct2-batch-tokens (1024 and 4096), fp32 and int8 compute on the same
exported weights, every inter_threads x intra_threads split whose product is --threads, the best
batch size and split kept: 4096 was its fastest on a Zen 4, 1024 on Sapphire Rapids), nmt's
`--engine ctranslate2` translator in a process of its own (bench/ct2_engine.py), the ratios,
how many lines are identical, and the whole `nmt translate` command (wall time, peak RSS) for
both engines next to a whole standalone CTranslate2 process doing the same work. Every time is
the best of --repeat runs (2): a shared CPU only ever slows a run down. Standalone CTranslate2 (at
its best split and batch size) and nmt's engine on it are timed in --rounds (3) alternating rounds
of processes, and the two whole commands alternately, so that a host whose speed drifts during
the bench slows both sides alike.

Also the model FLOP/s as a fraction of the fp32 matmul FLOP/s measured here with the same
threads (a ratio that survives a noisy machine): model FLOPs = 2 x (encoder non-embedding
parameters + decoder encoder-key/value projections) x source tokens + 2 x (the rest of the
decoder + vocabulary x d_model) x decoder rows, one row per hypothesis per step.

    .venv/bin/python bench/bench_translate.py [RUN_DIR ...] [--limit N] [--threads 2]
    make bench-translate RUNS="runs/mini runs/small"

RUN_DIR: trained run directories (their checkpoint_avg/best/last.pt). Without one, the bench
builds runs in a temporary folder: a joint BPE vocabulary (--vocab-size, 8000) learned on
Multi30k train (en+de) and randomly initialised models (--archs, `mini` and `small`). Random
weights almost never choose eos, so their outputs would run to the length limit (source + 50);
the bench then limits outputs to --max-len-a 1 --max-len-b 0, about a trained model's length on
test_2016_flickr, and skips CTranslate2: at the limit, one max_decoding_length for all lines
(what its users pass) is other work than nmt's per-line limits. Writes
bench/results/DATE_COMMIT_MACHINE_bench-translate.json and prints it as one JSON line last.

For the GPU check (the paper's `base`, newstest2014, bf16):
    python bench/bench_translate.py --archs base --device cuda --amp bf16 \\
        --source ../shared/data/wmt14/newstest2014.en.gz --threads 0 --max-tokens 16384 --no-cli --no-ct2
"""

from __future__ import annotations

import argparse
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
from common import DEFAULT_MULTI30K, REPO, matmul_flops, peak_rss_mib, positive_int, positive_ints, read_lines, write_result  # noqa: E402

sys.path.insert(0, str(REPO))


def build_random_run(root: Path, multi30k: Path, arch: str, vocab_size: int) -> Path:
    """A run directory with a learned vocabulary and a random model, as preprocess + train leave it."""
    import torch

    from nmt.run.checkpoint import save_checkpoint
    from nmt.run.identity import IDENTITY_KEY, run_identity
    from nmt.model.transformer import Transformer
    from nmt.model.config import build_config
    from nmt.run.directory import RunDir
    from nmt.data.tokenizer import load_tokenizer, train_tokenizer

    lines = [line for name in ("train.en.gz", "train.de.gz") for line in read_lines(multi30k / name)]
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


def time_in_process(run: Path, lines: list[str], beam: int, args, length: dict, **search_args) -> dict:
    from nmt.inference.translator import freeze_loaded_objects, load_translator
    from nmt.inference.config import SearchConfig, TranslateConfig

    search = SearchConfig(beam=beam, **length, **search_args)
    cfg = TranslateConfig(device=args.device, threads=args.threads, amp=args.amp, max_tokens=args.max_tokens)
    translator = load_translator(run, search=search, cfg=cfg)
    freeze_loaded_objects()  # as `nmt translate` does once its models are loaded
    translator.translate(lines[:32])  # warm-up: allocator, GEMM kernels
    translator.target_tokens = 0

    rows = [0]
    model_class = type(translator.models[0])  # a subclass of Transformer on a device (nmt.ops.optimize_for)
    decode_step = model_class.decode_step_hidden

    def counting_step(self, tokens, state):  # one Python call per step: no measurable cost
        rows[0] += tokens.numel()
        return decode_step(self, tokens, state)

    model_class.decode_step_hidden = counting_step
    try:
        seconds = math.inf
        for _ in range(args.repeat):  # the best of N: a shared CPU only ever slows a run down
            rows[0] = translator.target_tokens = 0
            start = time.perf_counter()
            out = translator.translate(lines)
            seconds = min(seconds, time.perf_counter() - start)
    finally:
        model_class.decode_step_hidden = decode_step
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


def time_command(cmd: list[str], repeat: int) -> tuple[float, float, str]:
    """(best wall seconds of `repeat` runs, largest peak RSS in MiB, stdout) of one command.

    Peak RSS from GNU time when there is one (getrusage's RUSAGE_CHILDREN is the max over all
    children this bench ever ran, so only an upper bound)."""
    timer = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").is_file() else []
    seconds, peak_kib, stdout = math.inf, 0, ""
    for _ in range(repeat):  # the best of N, as in-process
        start = time.perf_counter()
        proc = subprocess.run(timer + cmd, capture_output=True, cwd=REPO)
        seconds = min(seconds, time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:4])} ... failed: {proc.stderr.decode(errors='replace').strip()}")
        stdout = proc.stdout.decode("utf-8")
        peak_kib = max(peak_kib, int(proc.stderr.decode().split()[-1]) if timer else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return seconds, peak_kib / 1024, stdout


def time_cli(run: Path, source: Path, n_lines: int, args, length: dict, *extra: str, repeat: int = 0) -> dict:
    """The whole `nmt translate` command, start-up and model loading included: the best of
    `repeat` runs (0: --repeat)."""
    cmd = [sys.executable, "-m", "nmt_cli", "translate", "-r", str(run), "--input", str(source), "--quiet",
           "--threads", str(args.threads), "--device", args.device, "--amp", args.amp, "--max-tokens", str(args.max_tokens), *extra]
    for key, value in length.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    seconds, peak, stdout = time_command(cmd, repeat or args.repeat)
    return {"seconds": round(seconds, 2), "lines_in": n_lines, "lines_out": stdout.count("\n"), "peak_rss_mib": round(peak, 1)}


def thread_splits(threads: int) -> list[tuple[int, int]]:
    """(inter_threads, intra_threads) pairs whose product is `threads`: CTranslate2's two ways to use cores."""
    return [(inter, threads // inter) for inter in range(1, threads + 1) if threads % inter == 0]


def standalone_ctranslate2(model_dir: Path, plain: Path, out: Path, compute_type: str, repeat: int,
                           split: tuple[int, int], batch_tokens: int) -> tuple[dict, list[str]]:
    """bench/ct2_standalone.py in its own process: (its JSON line, whole-process wall and RSS; its output lines)."""
    cmd = [sys.executable, str(REPO / "bench" / "ct2_standalone.py"), str(model_dir), str(plain), str(out),
           "--inter", str(split[0]), "--intra", str(split[1]), "--compute-type", compute_type, "--repeat", str(repeat),
           "--max-batch-tokens", str(batch_tokens)]
    seconds, peak, stdout = time_command(cmd, 1)
    result = json.loads(stdout.strip().splitlines()[-1])
    result.update(process_s=round(seconds, 2), peak_rss_mib=round(peak, 1), batch_tokens=batch_tokens)
    return result, out.read_text(encoding="utf-8").splitlines()


def nmt_ctranslate2_engine(run: Path, plain: Path, out: Path, compute_type: str, args) -> tuple[dict, list[str]]:
    """nmt's `--engine ctranslate2` translator in a process of its own (bench/ct2_engine.py)."""
    cmd = [sys.executable, str(REPO / "bench" / "ct2_engine.py"), str(run), str(plain), str(out),
           "--threads", str(args.threads), "--compute-type", compute_type, "--repeat", str(args.repeat)]
    _, peak, stdout = time_command(cmd, 1)
    result = json.loads(stdout.strip().splitlines()[-1])
    result.update(peak_rss_mib=round(peak, 1))
    return result, out.read_text(encoding="utf-8").splitlines()


def exported_model_dir(run: Path) -> Path:
    """The CTranslate2 export of the run's default checkpoint (`nmt translate --engine
    ctranslate2`'s cached one, exported now if missing or stale). The export runs in a child,
    as everything CTranslate2 here: CTranslate2 and torch in one process bring two OpenMP
    runtimes that fight over the cores (pytorch/pytorch#98836)."""
    export = subprocess.run([sys.executable, "-c", "import sys; from nmt.run.directory import RunDir; "
                             "from nmt.run.checkpoint_choice import default_checkpoint; "
                             "from nmt.inference.ctranslate2_engine import cached_model_dir; "
                             "from pathlib import Path; r = RunDir(Path(sys.argv[1])); print(cached_model_dir(r, default_checkpoint(r))[0])", str(run)],
                            capture_output=True, text=True, cwd=REPO)
    if export.returncode != 0:  # the child's last line says why (an NmtError, or a traceback's last line)
        raise SystemExit(f"export of {run} failed: {(export.stderr.strip().splitlines() or ['no message'])[-1]}")
    return Path(export.stdout.strip().splitlines()[-1])


def compare_with_ctranslate2(run: Path, plain: Path, lines: list[str], nmt_out: list[str], args, say) -> dict:
    """CTranslate2 standalone (best thread split) vs nmt's engine on it, fp32 and int8, and the
    whole `nmt translate --engine ctranslate2` command vs a whole standalone process."""
    model_dir = exported_model_dir(run)
    result: dict = {"model_dir": str(model_dir)}
    work = plain.parent
    for compute_type in ("float32", "int8"):
        runs = [standalone_ctranslate2(model_dir, plain, work / f"ct2_{compute_type}_{i}_{tokens}.txt", compute_type, args.repeat,
                                       split, tokens)
                for i, split in enumerate(thread_splits(args.threads)) for tokens in args.ct2_batch_tokens]
        best, ct2_out = max(runs, key=lambda r: r[0]["sentences_per_s"])
        split, tokens = (best["inter_threads"], best["intra_threads"]), best["batch_tokens"]
        engine, engine_out = nmt_ctranslate2_engine(run, plain, work / f"engine_{compute_type}.txt", compute_type, args)
        for _ in range(args.rounds - 1):  # alternating processes: both sides see the same drift of a shared host
            again, _ = standalone_ctranslate2(model_dir, plain, work / f"ct2_{compute_type}_again.txt", compute_type,
                                              args.repeat, split, tokens)
            best = max(best, again, key=lambda r: r["sentences_per_s"])
            engine = max(engine, nmt_ctranslate2_engine(run, plain, work / f"engine_{compute_type}_again.txt", compute_type, args)[0],
                         key=lambda r: r["sentences_per_s"])
        entry = {
            "standalone": best | {"splits": {f"{r['inter_threads']}x{r['intra_threads']}, {r['batch_tokens']} tokens": r["sentences_per_s"]
                                                for r, _ in runs}},
            "nmt_engine": engine | {"ratio_to_standalone": round(engine["sentences_per_s"] / best["sentences_per_s"], 3),
                                    "identical_lines_to_standalone": sum(a == b for a, b in zip(engine_out, ct2_out))},
        }
        if compute_type == "float32":
            entry["identical_lines_nmt_fairseq_avg"] = sum(a == b for a, b in zip(nmt_out, ct2_out))
            result["standalone_out"] = ct2_out
        result[compute_type] = entry
        say(f"CTranslate2 {compute_type} standalone (own process, no torch), best of inter x intra and batch tokens "
            f"{entry['standalone']['splits']}: {best['sentences_per_s']} sentences/s; nmt --engine ctranslate2: "
            f"{engine['sentences_per_s']} sentences/s = {entry['nmt_engine']['ratio_to_standalone']}x "
            f"(torch imported: {engine['torch_imported']}; {entry['nmt_engine']['identical_lines_to_standalone']}/{len(lines)} lines identical)")
    # whole processes doing the same work once: load, tokenize, translate, detokenize, write
    fastest = result["float32"]["standalone"]
    split = (fastest["inter_threads"], fastest["intra_threads"])
    walls, clis = [], []
    for _ in range(args.repeat * args.rounds):  # alternating, one process at a time
        walls.append(standalone_ctranslate2(model_dir, plain, work / "ct2_whole.txt", "float32", 1, split, fastest["batch_tokens"])[0])
        clis.append(time_cli(run, plain, len(lines), args, {}, "--engine", "ctranslate2", "--beam-style", "fairseq",
                             "--lenpen-style", "avg", repeat=1))
    whole = min(walls, key=lambda r: r["process_s"])
    cli = min(clis, key=lambda r: r["seconds"]) | {"peak_rss_mib": max(c["peak_rss_mib"] for c in clis)}
    result["whole_command"] = {
        "standalone_process_s": whole["process_s"], "standalone_peak_rss_mib": max(w["peak_rss_mib"] for w in walls),
        "nmt_cli": cli, "ratio_wall_nmt_over_standalone": round(cli["seconds"] / whole["process_s"], 3),
    }
    say(f"whole command, fp32: standalone CTranslate2 process {whole['process_s']} s, peak RSS "
        f"{result['whole_command']['standalone_peak_rss_mib']} MiB; `nmt translate --engine ctranslate2` {cli['seconds']} s "
        f"({result['whole_command']['ratio_wall_nmt_over_standalone']}x), peak RSS {cli['peak_rss_mib']} MiB, "
        f"{cli['lines_out']}/{cli['lines_in']} lines out")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="*", type=Path, help="trained run directories (default: random models, see above)")
    parser.add_argument("--data", type=Path, default=DEFAULT_MULTI30K, help="Multi30k folder")
    parser.add_argument("--source", type=Path, help="lines to translate (default: DATA/test_2016_flickr.en.gz)")
    parser.add_argument("--limit", type=int, default=0, help="translate only the first N lines (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=0, help="nmt's --max-tokens (0: nmt translate's auto, per engine)")
    parser.add_argument("--ct2-batch-tokens", type=positive_ints, default=[1024, 4096],
                        help="standalone CTranslate2's max_batch_size in tokens, comma-separated: each is timed and the "
                             "fastest kept (nmt's engine uses --max-tokens)")
    parser.add_argument("--beams", type=positive_ints, default=[4, 1], help="beam sizes to time, comma-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="auto")
    parser.add_argument("--archs", default="mini,small", help="architectures of the random models, comma-separated")
    parser.add_argument("--vocab-size", type=int, default=8000, help="vocabulary of the random model")
    parser.add_argument("--repeat", type=positive_int, default=2,
                        help="time each nmt measurement N times and keep the fastest (peak RSS: the largest)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="time standalone CTranslate2 (at its best split and batch size) and nmt's engine on it in N "
                             "alternating rounds of processes, and the whole commands in --repeat x N alternating runs; "
                             "each side keeps its fastest")
    parser.add_argument("--no-cli", action="store_true", help="skip timing the whole command")
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    args = parser.parse_args()

    import torch

    from nmt.ops.cpu_malloc import keep_freed_memory

    # nmt's decoder is timed in this process: with the malloc settings `nmt translate` gives it on a CPU
    malloc = keep_freed_memory() if args.device == "cpu" else None
    source = args.source or args.data / "test_2016_flickr.en.gz"
    if not source.is_file():
        raise SystemExit(f"no input at {source}; pass --data or --source")

    with tempfile.TemporaryDirectory(prefix="bench_translate.") as tmp:
        lines = read_lines(source)
        if args.limit:
            lines = lines[: args.limit]
        plain = Path(tmp) / "input.txt"
        plain.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
        result: dict = {"bench": "translate", "source": str(source), "sentences": len(lines), "threads": args.threads,
                        "device": args.device, "max_tokens": args.max_tokens,
                        "ct2_standalone_batch_tokens": args.ct2_batch_tokens, "malloc": malloc, "models": {}}
        if args.run_dir:
            models = [(run.resolve().name, run, "trained", {}) for run in args.run_dir]
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

    for beam in args.beams:
        r = time_in_process(run, lines, beam, args, length)
        result[f"beam{beam}"] = r
        say(f"nmt beam {beam} (t2t): {r['sentences_per_s']} sentences/s, {r['target_tokens_per_s']} target tokens/s "
            f"({r['seconds']} s for {len(lines)} lines; model {r['model_gflop_per_s']} GFLOP/s)")
    nmt_same = time_in_process(run, lines, 4, args, length, beam_style="fairseq", lenpen_style="avg")
    nmt_out = time_in_process.last_output
    result["beam4_fairseq_avg"] = nmt_same
    say(f"nmt beam 4 (fairseq/avg): {nmt_same['sentences_per_s']} sentences/s")
    if not args.no_ct2 and weights == "random":
        say("CTranslate2 comparison skipped: random weights end every line at its length limit, where one "
            "max_decoding_length per call (what CTranslate2's users pass) does other work than nmt's per-line limits; "
            "pass a trained RUN_DIR")
    elif not args.no_ct2:
        ct2 = compare_with_ctranslate2(run, plain, lines, nmt_out, args, say)
        standalone = ct2["float32"]["standalone"]["sentences_per_s"]
        ct2.pop("standalone_out")
        for key in ("beam4", "beam4_fairseq_avg"):
            if key in result:
                result[key]["ratio_to_ct2_standalone_fp32"] = round(result[key]["sentences_per_s"] / standalone, 3)
        result["ctranslate2"] = ct2
        say(f"nmt native / standalone CTranslate2 fp32 ({standalone} sentences/s): "
            + (f"t2t {result['beam4']['ratio_to_ct2_standalone_fp32']}x, " if "beam4" in result else "t2t beam 4 not timed (--beams), ")
            + f"fairseq/avg {result['beam4_fairseq_avg']['ratio_to_ct2_standalone_fp32']}x; "
            f"{ct2['float32']['identical_lines_nmt_fairseq_avg']}/{len(lines)} lines identical (nmt fairseq/avg vs CTranslate2)")
    if not args.no_cli:
        c = time_cli(run, plain, len(lines), args, length)
        result["cli_beam4"] = c
        say(f"`nmt translate` beam 4, whole command: {c['seconds']} s, {c['lines_out']} lines out of "
            f"{c['lines_in']}, peak RSS {c['peak_rss_mib']} MiB")
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
