"""Decoding with terminology constraints and target prefixes on a trained run, as users run it.

    python bench/bench_constraints.py RUN [--lines 1000] [--threads 2] [--multi30k DIR]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--multi30k", type=Path, default=DEFAULT_MULTI30K)
    args = ap.parse_args()
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
