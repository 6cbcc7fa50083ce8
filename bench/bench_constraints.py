"""Decoding with terminology constraints and target prefixes on a trained run, as users run it.

    python bench/bench_constraints.py RUN [--lines 1000] [--threads 2] [--multi30k DIR]
    python bench/bench_constraints.py [RUN] --phrase-cost [--search-module OLD.py]

On test_2016_flickr, each `nmt translate` command is timed whole, in its own process, one at a time:
  - plain: the default search (t2t, beam 4, alpha 0.6);
  - constrained: `--constraints` with 1-2 phrases per line sampled from the reference (one
    word or two adjacent words, punctuation stripped; seeded): BLEU should rise, and every
    phrase should be in every output;
  - `--constraints` on the plain input (no line has a phrase): the plain search, as fast;
  - CTranslate2 agreement of `--prefix-file` (random reference prefixes of 1..n-1 words, none
    on every fifth line) with `--engine ctranslate2` (its target_prefix) on the run's export,
    both `--beam-style fairseq --lenpen-style avg`.
Prints BLEU (sacreBLEU, with its signature), sentences/s and the slowdown; writes a result file.

--phrase-cost times the constrained search's cost per phrase instead: one sentence at beam 16
with 0, 1, 4, 16 and 62 one-word phrases (0: the plain search, as a line without phrases
goes), in this process on one thread, on RUN's model or a random tiny one. --search-module
times another version of nmt/inference/constrained_search.py beside it (a copy of an older
commit's) and checks that both find the same hypotheses.
"""

from __future__ import annotations

import argparse
import gzip
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_MULTI30K, write_result  # noqa: E402


def sample_phrases(references: list[str], seed: int = 3) -> list[list[str]]:
    """1-2 phrases per reference: one word or two adjacent words, punctuation stripped."""
    rng = random.Random(seed)
    out = []
    for ref in references:
        words = [w for w in (w.strip('.,!?;:"') for w in ref.split()) if w]
        picked = []
        for _ in range(rng.choice((1, 2)) if words else 0):
            n = rng.choice((1, 2)) if len(words) > 1 else 1
            start = rng.randrange(len(words) - n + 1)
            picked.append(" ".join(words[start : start + n]))
        out.append(picked)
    return out


def random_prefixes(references: list[str], seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return ["" if i % 5 == 4 else " ".join(r.split()[: rng.randint(1, max(1, len(r.split()) - 1))])
            for i, r in enumerate(references)]


def translate(run: Path, input_path: Path, *flags: str) -> tuple[list[str], float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nmt_cli", "translate", "-r", str(run), "-i", str(input_path), "--quiet", *flags],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"nmt translate {' '.join(flags)} failed:\n{proc.stderr}")
    return proc.stdout.splitlines(), seconds


PHRASE_COUNTS = (0, 1, 4, 16, 62)


def load_search_module(path: Path) -> ModuleType:
    """A constrained_search.py from a path (another version of the module), imported on its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"constrained_search_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def phrase_cost(run: Optional[Path], search_module: Optional[Path], beam: int = 16, repeats: int = 3, seed: int = 0) -> dict:
    """Seconds of one 25-token sentence (random ids) searched with 0..62 one-word phrases
    (distinct random target ids), best of `repeats`, per search implementation."""
    import torch

    from nmt.inference import constrained_search
    from nmt.inference.beam_search import beam_search
    from nmt.inference.config import SearchConfig, TranslateConfig
    from nmt.inference.hypothesis import TargetRequest

    torch.set_num_threads(1)
    if run is not None:
        from nmt.inference.translator import load_translator

        model, what = load_translator(run, cfg=TranslateConfig(device="cpu", threads=1)).models[0], f"the model of {run}"
    else:
        from nmt.model.config import build_config
        from nmt.model.transformer import Transformer

        torch.manual_seed(seed)
        model, what = Transformer(build_config("tiny", 8000, 8000)).eval(), "a random tiny model (8,000 ids)"
    vocab = model.cfg.tgt_vocab_size
    rng = random.Random(seed)
    src = torch.tensor([[rng.randrange(4, vocab) for _ in range(25)] + [model.cfg.special_ids.eos]])
    words = rng.sample(range(4, vocab), max(PHRASE_COUNTS))
    cfg = SearchConfig(beam=beam)
    searches = {"current": constrained_search}
    if search_module is not None:
        searches[str(search_module)] = load_search_module(search_module)

    def timed(search, n_phrases: int) -> tuple[float, list]:
        best, found = float("inf"), None
        for _ in range(repeats):
            start = time.perf_counter()
            if n_phrases == 0:
                found = beam_search(model, src, cfg)
            else:
                found = search.constrained_beam_search(model, src, cfg, [TargetRequest((), tuple((w,) for w in words[:n_phrases]))])
            best = min(best, time.perf_counter() - start)
        return best, found

    seconds: dict[str, dict[int, float]] = {}
    outputs: dict[str, list] = {}
    for name, search in searches.items():
        timings = {n: timed(search, n) for n in PHRASE_COUNTS}
        seconds[name] = {n: t for n, (t, _) in timings.items()}
        outputs[name] = [found for _, found in timings.values()]
    print(f"one 25-token sentence, beam {beam}, one thread, best of {repeats}, on {what}; seconds (ratio to 0 phrases)")
    print("phrases" + "".join(f"  {name}" for name in seconds))
    for n in PHRASE_COUNTS:
        print(f"{n:>7}" + "".join(f"  {row[n]:.3f} s ({row[n] / row[0]:.2f}x)" for row in seconds.values()))
    same = len({repr(o) for o in outputs.values()}) == 1
    if len(searches) > 1:
        print(f"same hypotheses and scores from both: {same}")
    return {"model": what, "beam": beam, "repeats": repeats, "identical_outputs": same,
            "seconds": {name: {str(n): round(t, 4) for n, t in row.items()} for name, row in seconds.items()},
            "ratio_to_no_phrases": {name: {str(n): round(t / row[0], 2) for n, t in row.items()} for name, row in seconds.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, nargs="?", help="a trained run directory (optional with --phrase-cost)")
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--multi30k", type=Path, default=DEFAULT_MULTI30K)
    ap.add_argument("--phrase-cost", action="store_true", help="time one sentence with 0-62 one-word phrases instead")
    ap.add_argument("--search-module", type=Path, help="with --phrase-cost: another constrained_search.py to time beside")
    args = ap.parse_args()
    if args.phrase_cost:
        write_result("constraints-phrase-cost", phrase_cost(args.run, args.search_module))
        return
    if args.run is None:
        ap.error("RUN is needed, except with --phrase-cost")
    import sacrebleu

    with gzip.open(args.multi30k / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        src = [line.rstrip("\n") for _, line in zip(range(args.lines), f)]
    with gzip.open(args.multi30k / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        ref = [line.rstrip("\n") for _, line in zip(range(args.lines), f)]
    phrases = sample_phrases(ref)
    prefixes = random_prefixes(ref)
    threads = ["--threads", str(args.threads)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "src.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / "src.tsv").write_text("\n".join("\t".join([s, *p]) for s, p in zip(src, phrases)) + "\n", encoding="utf-8")
        (folder / "prefix.de").write_text("\n".join(prefixes) + "\n", encoding="utf-8")
        plain, plain_s = translate(args.run, folder / "src.en", *threads)
        constrained, constrained_s = translate(args.run, folder / "src.tsv", "--constraints", *threads)
        unasked, unasked_s = translate(args.run, folder / "src.en", "--constraints", *threads)  # the flag, no phrases
        fair = ["--beam-style", "fairseq", "--lenpen-style", "avg", *threads]
        nmt_prefix, nmt_prefix_s = translate(args.run, folder / "src.en", "--prefix-file", str(folder / "prefix.de"), *fair)
        ct2_prefix, ct2_prefix_s = translate(args.run, folder / "src.en", "--prefix-file", str(folder / "prefix.de"),
                                             "--engine", "ctranslate2", *fair)
    metric = sacrebleu.BLEU()
    bleu = {name: metric.corpus_score(hyps, [ref]) for name, hyps in (("plain", plain), ("constrained", constrained))}
    signature = str(metric.get_signature())
    met = sum(all(p in out for p in ps) for out, ps in zip(constrained, phrases))
    n_phrases = sum(map(len, phrases))
    agree = sum(a == b for a, b in zip(nmt_prefix, ct2_prefix))
    starts = sum(out.startswith(p) for out, p in zip(nmt_prefix, prefixes))
    rows = {
        "plain": {"bleu": round(bleu["plain"].score, 2), "seconds": round(plain_s, 2), "sentences_per_s": round(len(src) / plain_s, 1)},
        "constrained": {"bleu": round(bleu["constrained"].score, 2), "seconds": round(constrained_s, 2),
                        "sentences_per_s": round(len(src) / constrained_s, 1), "phrases": n_phrases,
                        "lines_with_every_phrase": met},
        "constraints_flag_without_phrases": {"seconds": round(unasked_s, 2), "sentences_per_s": round(len(src) / unasked_s, 1),
                                             "identical_to_plain": sum(a == b for a, b in zip(unasked, plain))},
        "prefix_nmt": {"seconds": round(nmt_prefix_s, 2), "lines_starting_with_prefix": starts},
        "prefix_ctranslate2": {"seconds": round(ct2_prefix_s, 2)},
    }
    print(f"{len(src)} lines of test_2016_flickr, {args.threads} threads, whole commands")
    print(f"plain        BLEU {bleu['plain'].score:.2f}  {len(src) / plain_s:.1f} sentences/s")
    print(f"constrained  BLEU {bleu['constrained'].score:.2f} ({bleu['constrained'].score - bleu['plain'].score:+.2f})  "
          f"{len(src) / constrained_s:.1f} sentences/s ({constrained_s / plain_s:.2f}x the time); "
          f"{met}/{len(src)} lines hold all of their {n_phrases} phrases")
    print(f"--constraints on lines without phrases: {len(src) / unasked_s:.1f} sentences/s ({unasked_s / plain_s:.2f}x the time), "
          f"{rows['constraints_flag_without_phrases']['identical_to_plain']}/{len(src)} lines identical to plain")
    print(f"prefix       nmt and CTranslate2 agree on {agree}/{len(src)} lines; {starts}/{len(src)} start with their prefix")
    print(f"sacreBLEU    {signature}")
    write_result(f"constraints-{args.run.name}", {"run": str(args.run), "lines": len(src), "threads": args.threads,
                                                  "bleu_signature": signature,
                                                  "constrained_time_ratio": round(constrained_s / plain_s, 3),
                                                  "prefix_agreement_with_ctranslate2": agree, **rows})


if __name__ == "__main__":
    main()
