"""`make recipe-wmt14-ende`: the paper's WMT14 English->German pipeline, end to end.

Vaswani et al. (2017), Section 5.1: "the standard WMT 2014 English-German dataset consisting
of about 4.5 million sentence pairs. Sentences were encoded using byte-pair encoding, which
has a shared source-target vocabulary of about 37000 tokens. [...] Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens." Section 5.2: 8 P100 GPUs; checkpoints every 10 minutes; Section 6.1: the
last 5 (base) or 20 (big) checkpoints averaged, beam 4, length penalty alpha 0.6.

Data, as fairseq's and tensor2tensor's WMT14 En-De setups use it:
  training  Europarl v7 + Common Crawl + News Commentary v9 (statmt.org WMT13/WMT14 tarballs)
  valid     newstest2013 (dev.tgz), 3000 lines
  test      newstest2014, the FULL version of test-full.tgz: 3003 lines. sacreBLEU calls it
            `wmt14/full`; fairseq and tensor2tensor score on it. (sacreBLEU's plain `wmt14`
            is the filtered test-filtered.tgz version with 2737 lines: not used here.)

Steps: fetch (download or extract what is missing) -> gather the text into RUN_DIR/text ->
nmt preprocess (clean with --max-len 250 --max-ratio 1.5, joint BPE 37000) -> nmt train
--arch big on all GPUs -> nmt average-checkpoints -> nmt translate -> nmt score (sacreBLEU)
-> nmt score --compound-split (the paper's tokenized BLEU) -> plot -> summary.

WMT14_DIR=... uses already downloaded files: the tarballs themselves, their extracted
layout (training/, commoncrawl.de-en.*, dev/, test-full/), or plain
newstest2013.{en,de}[.gz] / newstest2014.{en,de}[.gz]; whatever is missing is downloaded.
DRY_RUN=1 prints the whole plan and runs nothing; the plan states the disk and the GPU hours
it needs, from the measurements committed in bench/results/ (docs/recipes.md). Without a GPU
the recipe refuses to train unless ALLOW_CPU=1. For several nodes, run the printed `nmt train`
command under torchrun on each node, with NUM_GPUS set to the total number of GPUs so that
--update-freq fits.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from common import (RecipeError, Step, averaged_from, download, fit_average, flag_value, format_duration, main_guard, parse_setting, run_steps,
                    settings_from_env, training_stats, write_json)

# ---------------------------------------------------------------------------------------
# Training defaults (the paper's), each overridable by the environment variable of its name.
# ---------------------------------------------------------------------------------------
TRAINING: dict[str, Any] = {
    "ARCH": "big",                 # big (paper 28.4 BLEU) or base (27.3); `nmt archs` lists all
    "VOCAB": 37000,                # shared source-target BPE of "about 37000 tokens"
    "VOCAB_SAMPLE_LINES": 1000000, # BPE learned from this many sampled training pairs
    "MAX_LEN": 250,                # cleaning: drop pairs with a side over 250 words (fairseq's script)
    "MAX_RATIO": 1.5,              # cleaning: drop pairs whose length ratio exceeds 1.5 (fairseq's script)
    "TOKENS_PER_UPDATE": 25000,    # per side: the paper's ~25000 source + 25000 target tokens per batch
    "MAX_TOKENS": 4096,            # per GPU and side (--max-tokens); --update-freq makes up the rest
    "WARMUP": 4000,                # the paper's warmup_steps (Section 5.3)
    "LR": "",                      # empty: the paper's lrate formula; a number: fairseq-style peak --lr
    "DROPOUT": "",                 # empty: the architecture's (0.3 big En-De, 0.1 base)
    "AMP": "auto",                 # bf16 on GPUs that support it
    "MAX_UPDATE": 0,               # 0: from ARCH, the paper's 300000 (big) or 100000 (base) steps
    "MAX_TIME": "",                # optional wall-clock limit, e.g. 84h
    "SAVE_INTERVAL_MINUTES": 10.0, # the paper's 10-minute checkpoints
    "AVERAGE_LAST": 0,             # 0: from ARCH, the paper's 20 (big) or 5 (base)
    "LOG_INTERVAL": 100,
    "TRAIN_ARGS": "",              # any further `nmt train` flags
}

DECODING: dict[str, Any] = {"BEAM": 4, "LENPEN": 0.6}  # Section 6.1

# After the paper's model: a fast student distilled from it (nmt distill; docs/distillation.md).
DISTILLATION: dict[str, Any] = {
    "DISTILL": False,              # 1: add the student's steps after the teacher's summary
    "STUDENT_ARCH": "student-tiny",  # 6+2 layers, d_model 256 (Bergamot's tiny size)
    "DISTILL_BEAM": 8,             # the teacher's beam and n-best when it translates the training set (Mozilla's 8)
    "STUDENT_MAX_UPDATE": 100000,
}

SETUP: dict[str, Any] = {
    "RUN_DIR": "runs/wmt14-en-de",
    "WMT14_DIR": None,             # already downloaded files (see the module docstring)
    "WMT14_URL": "https://www.statmt.org/",
    "DOWNLOAD_TIMEOUT": 30.0,
    "NUM_GPUS": None,              # unset: torch.cuda.device_count(); set: also --distributed-world-size
    "ALLOW_CPU": False,            # train without a GPU anyway (months for big)
    "GPU_SCALING": 0.9,            # the plan's hours: assumed throughput share kept on several GPUs (not measured)
    "ENCODING_ERRORS": "replace",  # crawled text has the odd invalid byte: replace it, do not stop
    "THREADS": 0,
    "DRY_RUN": False,
}

PROG = "recipes/wmt14_ende.py"
SRC, TGT = "en", "de"
PAPER_STEPS = {"big": 300000, "base": 100000}
PAPER_AVERAGE = {"big": 20, "base": 5}
FULL_TEST_LINES, FILTERED_TEST_LINES = 3003, 2737


# ---------------------------------------------------------------------------------------
# The data: where each part lives in the statmt.org tarballs
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One parallel text of the recipe and the names it has in the tarballs or elsewhere."""

    name: str
    tarball: str                       # path under WMT14_URL
    plain: tuple[str, str]             # plain text file names (src, tgt), maybe also .gz
    sgm: Optional[tuple[str, str]] = None  # SGML test files (src, ref)
    sgm_dir: Optional[str] = None      # the folder the right SGML version is in
    pairs: int = 0                     # en-de sentence pairs (training parts), for the plan

    @property
    def tarball_name(self) -> str:
        return self.tarball.rsplit("/", 1)[-1]

    def member_names(self) -> set[str]:
        return set(self.plain) | set(self.sgm or ())


TRAIN_PARTS = [
    Part("Europarl v7", "wmt13/training-parallel-europarl-v7.tgz", ("europarl-v7.de-en.en", "europarl-v7.de-en.de"),
         pairs=1_920_000),
    Part("Common Crawl", "wmt13/training-parallel-commoncrawl.tgz", ("commoncrawl.de-en.en", "commoncrawl.de-en.de"),
         pairs=2_400_000),
    Part("News Commentary v9", "wmt14/training-parallel-nc-v9.tgz",
         ("news-commentary-v9.de-en.en", "news-commentary-v9.de-en.de"), pairs=200_000),
]
VALID = Part("newstest2013", "wmt14/dev.tgz", ("newstest2013.en", "newstest2013.de"),
             ("newstest2013-src.en.sgm", "newstest2013-ref.de.sgm"), "dev")
TEST = Part("newstest2014", "wmt14/test-full.tgz", ("newstest2014.en", "newstest2014.de"),
            ("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"), "test-full")
PARTS = [*TRAIN_PARTS, VALID, TEST]


def _find(roots: list[Path], name: str, prefer_dir: Optional[str]) -> Optional[Path]:
    """`name` (or `name`.gz) under the first root holding it; in `prefer_dir` if there is one there."""
    for root in roots:
        if not root.is_dir():
            continue
        found = sorted((p for n in (name, name + ".gz") for p in root.rglob(n) if p.is_file()),
                       key=lambda p: (p.parent.name != prefer_dir, len(p.parts), str(p)))
        if found:
            return found[0]
    return None


def locate(part: Part, roots: list[Path]) -> Optional[tuple[Path, Path]]:
    """The (source, target) files of `part`: plain text first, else the SGML test files."""
    for names, prefer in ((part.plain, None), (part.sgm, part.sgm_dir)):
        if names is None:
            continue
        src, tgt = (_find(roots, n, prefer) for n in names)
        if src is not None and tgt is not None:
            # the filtered test set has the same SGML names in test/: only test-full will do
            if names == part.sgm and part.sgm_dir and src.parent.name != part.sgm_dir:
                continue
            return src, tgt
    return None


def data_roots(s: dict[str, Any]) -> list[Path]:
    roots = [Path(s["WMT14_DIR"])] if s["WMT14_DIR"] else []
    return roots + [Path(s["RUN_DIR"]) / "raw"]


def fetch(s: dict[str, Any]) -> None:
    """Make every part available: extract it from a tarball at hand, or download the tarball first."""
    raw = Path(s["RUN_DIR"]) / "raw"
    roots = data_roots(s)
    for part in PARTS:
        if locate(part, roots) is not None:
            continue
        tarball = next((r / part.tarball_name for r in roots if (r / part.tarball_name).is_file()), None)
        if tarball is None:
            tarball = raw / part.tarball_name
            print(f"    downloading {s['WMT14_URL']}{part.tarball} for {part.name}", flush=True)
            download(s["WMT14_URL"] + part.tarball, tarball, s["DOWNLOAD_TIMEOUT"],
                     "without network, set WMT14_DIR to a folder with the WMT14 files (see recipes/wmt14_ende.py)")
        print(f"    extracting {part.name} from {tarball}", flush=True)
        extract(tarball, part.member_names(), raw)
        if locate(part, roots) is None:
            raise RecipeError(f"{tarball} holds no {' / '.join(sorted(part.member_names()))}; "
                              f"is it the right file? delete it to download it again")


def extract(tarball: Path, names: set[str], dest: Path) -> None:
    """Extract the members of `tarball` whose file name is in `names`, each atomically."""
    try:
        with tarfile.open(tarball) as tar:
            for member in tar:
                if not member.isfile() or Path(member.name).name not in names:
                    continue
                relative = Path(*[p for p in Path(member.name).parts if p not in ("", ".", "..", "/")])
                out = dest / relative
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_name(f".{out.name}.part")
                with tar.extractfile(member) as f, open(tmp, "wb") as w:  # type: ignore[union-attr]
                    while block := f.read(1 << 22):
                        w.write(block)
                os.replace(tmp, out)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise RecipeError(f"cannot read {tarball} ({e}); delete it to download it again") from None


# ---------------------------------------------------------------------------------------
# Gathering the text: one training file per language, plain valid and test files
# ---------------------------------------------------------------------------------------

SEG = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)


def read_sgm(path: Path, errors: str) -> list[str]:
    """The <seg> lines of a WMT SGML file, whitespace collapsed as sacreBLEU does (no unescaping)."""
    from nmt.data.textio import open_binary

    with open_binary(path) as f:
        text = f.read().decode("utf-8", errors=errors)
    return [re.sub(r"\s+", " ", m.group(1).strip()) for line in text.splitlines() if (m := SEG.search(line))]


def _lines_bytes(path: Path) -> Iterator[bytes]:
    from nmt.data.textio import open_binary

    with open_binary(path) as f:
        for line in f:
            yield line if line.endswith(b"\n") else line + b"\n"


def gather(s: dict[str, Any], text_dir: Path) -> None:
    """Write text/train.{en,de} (the three corpora concatenated), newstest2013.* and newstest2014.*.

    Skipped when text/sources.json says the same source files were gathered already, so the
    text files keep their dates and `nmt preprocess` stays a no-op.
    """
    roots = data_roots(s)
    found = {part.name: locate(part, roots) for part in PARTS}
    missing = [name for name, paths in found.items() if paths is None]
    if missing:
        raise RecipeError(f"cannot find {', '.join(missing)} in {' or '.join(map(str, roots))}; re-run to fetch them")
    sources = {name: [[str(p), p.stat().st_size] for p in paths] for name, paths in found.items()}  # type: ignore[union-attr]
    record = text_dir / "sources.json"
    if record.is_file() and json.loads(record.read_text(encoding="utf-8")) == sources:
        print(f"    already gathered from the same files ({record}); nothing to do", flush=True)
        return
    text_dir.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)

    outs = {lang: text_dir / f"train.{lang}" for lang in (SRC, TGT)}
    tmps = {lang: p.with_name(f".{p.name}.part") for lang, p in outs.items()}
    with open(tmps[SRC], "wb") as out_src, open(tmps[TGT], "wb") as out_tgt:
        for part in TRAIN_PARTS:
            src, tgt = found[part.name]  # type: ignore[misc]
            n_src = sum(out_src.write(line) > 0 for line in _lines_bytes(src))
            n_tgt = sum(out_tgt.write(line) > 0 for line in _lines_bytes(tgt))
            if n_src != n_tgt:
                raise RecipeError(f"{part.name} is not parallel: {n_src} lines in {src} but {n_tgt} in {tgt}; "
                                  f"delete them to fetch them again")
            print(f"    {part.name}: {n_src:,} pairs from {src.parent}", flush=True)
    for lang in (SRC, TGT):
        os.replace(tmps[lang], outs[lang])

    for part in (VALID, TEST):
        src, tgt = found[part.name]  # type: ignore[misc]
        if src.name.endswith(".sgm"):
            lines = {SRC: read_sgm(src, s["ENCODING_ERRORS"]), TGT: read_sgm(tgt, s["ENCODING_ERRORS"])}
        else:
            lines = {lang: [b.decode("utf-8", s["ENCODING_ERRORS"]).rstrip("\n") for b in _lines_bytes(p)]
                     for lang, p in ((SRC, src), (TGT, tgt))}
        if len(lines[SRC]) != len(lines[TGT]):
            raise RecipeError(f"{part.name} is not parallel: {len(lines[SRC])} lines in {src} but {len(lines[TGT])} in {tgt}")
        for lang in (SRC, TGT):
            out = text_dir / f"{part.name}.{lang}"
            tmp = out.with_name(f".{out.name}.part")
            tmp.write_text("".join(line + "\n" for line in lines[lang]), encoding="utf-8")
            os.replace(tmp, out)
        note = ""
        if part is TEST and len(lines[SRC]) == FILTERED_TEST_LINES:
            note = (f" -- the FILTERED version; the paper-comparable full one has {FULL_TEST_LINES} lines "
                    f"(test-full.tgz)")
        elif part is TEST and len(lines[SRC]) != FULL_TEST_LINES:
            note = f" (the real full newstest2014 has {FULL_TEST_LINES})"
        print(f"    {part.name}: {len(lines[SRC]):,} lines from {src}{note}", flush=True)
    write_json(record, sources)


# ---------------------------------------------------------------------------------------
# The batch: --update-freq from the number of GPUs
# ---------------------------------------------------------------------------------------


def update_freq(tokens_per_update: int, max_tokens: int, processes: int) -> int:
    """Batches to accumulate so that an update holds about `tokens_per_update` tokens per side."""
    return max(1, round(tokens_per_update / (max_tokens * max(1, processes))))


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def gpu_name() -> Optional[str]:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.device_count() else None


# ---------------------------------------------------------------------------------------
# The cost: disk and GPU hours, from the committed measurements in bench/results/
# ---------------------------------------------------------------------------------------

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
# Assumed, not measured (the corpus is not here to measure before it is fetched): WMT14's
# training lines run about 23 words, and a 37k joint BPE splits some of them.
BYTES_PER_LINE = 135
TOKENS_PER_LINE = 30


def train_pairs() -> int:
    return sum(p.pairs for p in TRAIN_PARTS)


def latest_result(results: Path, pattern: str) -> Optional[tuple[Path, dict[str, Any]]]:
    """The newest bench/results file matching `pattern` (file names begin with the date)."""
    found = sorted(results.glob(pattern))
    return (found[-1], json.loads(found[-1].read_text(encoding="utf-8"))) if found else None


def checkpoint_bytes_per_parameter(results: Path) -> tuple[float, str]:
    """Bytes a parameter takes in a checkpoint with Adam's moments, measured by `make bench-scale`;
    without that measurement, fp32 weights plus two fp32 moments."""
    found = latest_result(results, "*_bench-scale.json")
    c = found[1].get("results", {}).get("big_checkpoint") if found else None
    if not c:
        return 12.0, "4-byte weights + Adam's 2 moments (no bench-scale checkpoint measurement found)"
    params = c.get("parameters_m") or float(str(c["parameters"]).rstrip("M"))
    mib = c.get("size_mib") or c["mib"]
    return mib * 2**20 / (params * 1e6), f"{mib:,.0f} MiB for {params:g}M parameters in {found[0].relative_to(results.parents[1])}"


def model_parameters(arch: str, vocab: int) -> int:
    """The model's parameters, built on the meta device: no memory, no time."""
    import torch

    from nmt.model.config import build_config
    from nmt.model.transformer import Transformer, count_parameters as count

    with torch.device("meta"):
        return count(Transformer(build_config(arch, vocab, vocab)))


def disk_estimate(s: dict[str, Any], results: Path = RESULTS) -> list[tuple[str, float, str]]:
    """(what, bytes, how it is counted) for everything the recipe writes under RUN_DIR, at the
    peak: the end of training, with the averaged checkpoint written."""
    from nmt.data.token_arrays import token_dtype

    missing = [p for p in PARTS if locate(p, data_roots(s)) is None]
    extracted = sum(p.pairs for p in missing) * BYTES_PER_LINE * 2
    pairs = train_pairs()
    id_bytes = token_dtype(s["VOCAB"]).itemsize
    per_param, source = checkpoint_bytes_per_parameter(results)
    ckpt = model_parameters(s["ARCH"], s["VOCAB"]) * per_param
    kept = s["AVERAGE_LAST"] + 2
    return [
        ("raw", extracted,
         f"the en-de text of {len(missing)} statmt.org tarball(s) extracted ({extracted / 1e9:.1f} GB, as below), "
         f"+ the tarballs themselves, kept (their size is statmt.org's; not counted here)"
         if missing else "every part is at hand: nothing to download"),
        ("text", pairs * BYTES_PER_LINE * 2,
         f"{pairs / 1e6:.2f}M pairs x about {BYTES_PER_LINE} bytes a line x 2 sides (assumed)"),
        ("data", pairs * 2 * (TOKENS_PER_LINE * id_bytes + 8),
         f"binarized: {pairs / 1e6:.2f}M pairs x about {TOKENS_PER_LINE} BPE tokens a line (assumed) x {id_bytes} bytes "
         f"a token id x 2 sides, + 8-byte offsets"),
        ("checkpoints", kept * ckpt + ckpt / 3,
         f"{kept} x {ckpt / 1e9:.2f} GB (--arch {s['ARCH']} with Adam's moments: {per_param:.2f} bytes a parameter, "
         f"{source}): the last {s['AVERAGE_LAST']} kept, 1 written before the oldest goes, checkpoint_best.pt; "
         f"+ checkpoint_avg.pt {ckpt / 3e9:.2f} GB (weights only: Adam's moments are the other two thirds); "
         f"no CTranslate2 export in this recipe"),
    ]


@dataclass(frozen=True)
class GpuRate:
    """A committed `make bench-train-gpu` measurement: what the hours are computed from."""

    path: Path
    kind: str                  # the machine slug of the file name (DATE_COMMIT_MACHINE_bench-NAME.json)
    machine: str
    arch: str
    max_tokens: int            # --max-tokens of its steps (one step an update)
    tokens_per_s: float        # target tokens/s with nmt's attention; the slowest run when there are several
    step_ms: Optional[float]   # the time of one step
    host_ms: Optional[float]   # the host CPU time of one step, when profiled

    @property
    def fill(self) -> float:
        """The share of a step's --max-tokens that were target tokens (padding and the longer side
        take the rest); without a step time, 1: padding counted, so the hours are at most."""
        return self.tokens_per_s * self.step_ms / 1000 / self.max_tokens if self.step_ms else 1.0


def gpu_rate(results: Path = RESULTS) -> Optional[GpuRate]:
    """The newest GPU training measurement: the curated file (nmt's flash/memory-efficient
    attention, a host profile) or bench_train.py's own output (its bf16 run)."""
    found = latest_result(results, "*_bench-train[-_]gpu.json")
    if found is None:
        return None
    path, record = found
    r = record.get("results", {})
    curated, own = r.get("flash_or_memory_efficient", {}), r.get("bf16", {})
    runs = curated.get("target_tokens_per_s") or own.get("tgt_tokens_per_s")
    if not runs:
        return None
    runs = runs if isinstance(runs, list) else [runs]
    profile = r.get("profile", {})
    step_ms = profile.get("update_ms_measured") or (own["seconds"] * 1000 / own["updates"] if own.get("updates") else None)
    return GpuRate(path, path.name.split("_")[2].upper(), record.get("machine", ""), r.get("arch") or record.get("arch", ""),
                   int(r.get("max_tokens") or record.get("max_tokens", 0)), float(min(runs)), step_ms,
                   profile.get("host_cpu_ms"))


def training_hours(updates: int, max_tokens_per_update: int, steps_per_update: int, gpus: int, scaling: float,
                   rate: GpuRate) -> tuple[float, Optional[float]]:
    """(hours of GPU work at the measured tokens/s, hours if every step costs the host what the
    profiled one did). The second bounds small steps: the profiled host was busy the whole step,
    launching kernels, and a smaller batch launches the same kernels."""
    by_tokens = updates * max_tokens_per_update * rate.fill / (rate.tokens_per_s * gpus * scaling) / 3600
    by_host = updates * steps_per_update * rate.host_ms / 1000 / scaling / 3600 if rate.host_ms else None
    return by_tokens, by_host


def print_time(s: dict[str, Any], gpus: int, freq: int, per_update: int, gpu_name: Optional[str],
               results: Path = RESULTS) -> None:
    rate = gpu_rate(results)
    if gpus == 0:
        print("time: not estimated for training on the CPU; NUM_GPUS=8 plans (and estimates) for 8 GPUs")
        return
    if rate is None:
        print(f"time: not estimated: no GPU training throughput measurement (*_bench-train-gpu.json with target "
              f"tokens/s) is committed in {results}; `make bench-train-gpu` on a GPU writes one")
        return
    source = rate.path.relative_to(results.parents[1])
    if rate.arch != s["ARCH"] or s["AMP"] not in ("auto", "bf16"):
        print(f"time: not estimated: the committed GPU measurement ({source}) is of --arch {rate.arch} in bf16, "
              f"not --arch {s['ARCH']} with AMP={s['AMP']}")
        return
    scaling = s["GPU_SCALING"] if gpus > 1 else 1.0
    by_tokens, by_host = training_hours(s["MAX_UPDATE"], per_update, freq, gpus, scaling, rate)
    if gpu_name is None:
        kind = f"the GPUs' kind is unknown here (none visible): the estimate is for the measured kind, {rate.kind}"
    elif rate.kind.lower() in gpu_name.lower().replace(" ", ""):
        kind = f"the GPUs here ({gpu_name}) are the measured kind"
    else:
        kind = f"the GPUs here are {gpu_name}: the estimate is for the measured kind, {rate.kind}, not them"
    print(f"time: about {max(by_tokens, by_host or 0):.1f} h for {s['MAX_UPDATE']} updates on {gpus} GPU(s), from "
          f"{source} ({rate.machine}: --arch {rate.arch}, bf16, --max-tokens {rate.max_tokens}: "
          f"{rate.tokens_per_s:,.0f} target tokens/s" + (f", {rate.step_ms:g} ms a step" if rate.step_ms else "")
          + (f", {rate.host_ms:g} ms of host CPU a step" if rate.host_ms else "") + ")"
          + (", the larger of:" if by_host else ":"))
    fill = (f"{per_update} x {rate.fill:.2f}, the measured steps' share of target tokens in --max-tokens"
            if rate.step_ms else f"{per_update}, padding counted: at most")
    print(f"  GPU work: {s['MAX_UPDATE']} updates x {per_update * rate.fill:,.0f} target tokens ({fill}) / "
          f"({rate.tokens_per_s:,.0f} tokens/s x {gpus} GPU(s) x {scaling:g} scaling) = {by_tokens:.1f} h")
    if by_host:
        print(f"  host:     {s['MAX_UPDATE']} updates x {freq} step(s) per GPU x {rate.host_ms:g} ms / {scaling:g} scaling "
              f"= {by_host:.1f} h (a step of any size launches the same kernels)")
    notes = [f"GPU_SCALING={scaling:g} is assumed (no multi-GPU run is measured)" if gpus > 1 else "",
             f"measured with {rate.max_tokens} tokens a step, this plan steps with MAX_TOKENS={s['MAX_TOKENS']}"
             if rate.max_tokens != s["MAX_TOKENS"] else "", kind]
    print("  note: " + "; ".join(n for n in notes if n))


def print_disk(s: dict[str, Any], results: Path = RESULTS) -> None:
    items = disk_estimate(s, results)
    print(f"disk: about {sum(b for _, b, _ in items) / 1e9:.1f} GB in {s['RUN_DIR']} at the end of training:")
    for what, size, how in items:
        print(f"  {what:<11} {size / 1e9:5.1f} GB  {how}")


# ---------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------


def build_steps(s: dict[str, Any], freq: int) -> list[Step]:
    run = Path(s["RUN_DIR"])
    text = run / "text"
    hyp = run / f"{TEST.name}.hyp.{TGT}"
    sacrebleu_json = run / f"{TEST.name}.sacrebleu.json"
    compound_json = run / f"{TEST.name}.compound_split.json"
    threads = ["--threads", str(s["THREADS"])] if s["THREADS"] else []
    steps = [
        Step("fetch the WMT14 data (what is not at hand yet)", action=lambda: fetch(s),
             describe=f"look in {' and '.join(map(str, data_roots(s)))}; download missing tarballs from "
                      f"{s['WMT14_URL']} into {run / 'raw'} and extract the en-de files"),
        Step("gather the text", action=lambda: gather(s, text),
             describe=f"concatenate {' + '.join(p.name for p in TRAIN_PARTS)} into {text}/train.{{{SRC},{TGT}}}; "
                      f"{VALID.name} and {TEST.name} into {text}/{{{VALID.name},{TEST.name}}}.{{{SRC},{TGT}}}"),
        Step(f"preprocess: clean (max {s['MAX_LEN']} words, ratio {flag_value(s['MAX_RATIO'])}), "
             f"joint BPE {s['VOCAB']}, binarize (a no-op if already done)", args=[
            "preprocess", "--run-dir", run, "--source-lang", SRC, "--target-lang", TGT,
            "--trainpref", text / "train", "--validpref", text / VALID.name, "--testpref", text / TEST.name,
            "--vocab-size", s["VOCAB"], "--vocab-sample-lines", s["VOCAB_SAMPLE_LINES"],
            "--max-len", s["MAX_LEN"], "--max-ratio", flag_value(s["MAX_RATIO"]),
            "--encoding-errors", s["ENCODING_ERRORS"], *(["--workers", str(s["THREADS"])] if s["THREADS"] else []),
        ]),
        Step(f"train --arch {s['ARCH']} (resumes from checkpoint_last.pt; nothing to do when finished)", args=[
            "train", "--run-dir", run, "--arch", s["ARCH"], "--max-tokens", s["MAX_TOKENS"], "--update-freq", freq,
            "--warmup", s["WARMUP"], *(["--lr", s["LR"]] if s["LR"] else []),
            *(["--dropout", s["DROPOUT"]] if s["DROPOUT"] else []), "--amp", s["AMP"],
            "--max-update", s["MAX_UPDATE"], *(["--max-time", s["MAX_TIME"]] if s["MAX_TIME"] else []),
            "--save-interval-minutes", flag_value(s["SAVE_INTERVAL_MINUTES"]), "--keep-last", s["AVERAGE_LAST"],
            "--no-epoch-checkpoints", "--log-interval", s["LOG_INTERVAL"],
            *(["--distributed-world-size", str(s["NUM_GPUS"])] if s["NUM_GPUS"] else []),
            *threads, *shlex.split(s["TRAIN_ARGS"]),
        ]),
        Step(f"average the last {s['AVERAGE_LAST']} interval checkpoints into checkpoint_avg.pt", prepare=fit_average(s, run, "updates"),
             args=["average-checkpoints", "--run-dir", run, "--last", str(s["AVERAGE_LAST"]), "--kind", "updates"]),
        Step(f"translate {TEST.name} with beam {s['BEAM']}, alpha {flag_value(s['LENPEN'])}", stdout=hyp, args=[
            "translate", "--run-dir", run, "--checkpoint", "checkpoint_avg.pt", "--input", text / f"{TEST.name}.{SRC}",
            "--beam", s["BEAM"], "--lenpen", flag_value(s["LENPEN"]), *threads,
        ]),
        Step("score with sacreBLEU (detokenized, 13a, cased: the number to report)", stdout=sacrebleu_json, args=[
            "score", "--ref", text / f"{TEST.name}.{TGT}", "--hyp", hyp, "--lang", TGT, "--json",
        ]),
        Step("score with the paper's tokenized compound-split BLEU (to compare with the paper only)",
             stdout=compound_json, args=[
            "score", "--ref", text / f"{TEST.name}.{TGT}", "--hyp", hyp, "--lang", TGT, "--compound-split", "--json",
        ]),
        Step("plot the learning curves into learning_curves.png", prepare=_need_matplotlib(run),
             args=["plot", "--run-dir", run]),
        Step("summary", action=lambda: summarize(s, run, hyp, sacrebleu_json, compound_json),
             describe=f"print both scores, training time, updates and tokens/s; write {run / 'summary.json'}"),
    ]
    if s["DISTILL"]:
        steps += distillation_steps(s, freq, run, text, threads)
    return steps


def distillation_steps(s: dict[str, Any], freq: int, teacher: Path, text: Path, threads: list[str]) -> list[Step]:
    """The student: the teacher translates the (cleaned) training text, keeping of its n-best the
    hypothesis of highest chrF against the reference; a STUDENT_ARCH model trains on that pair
    with the teacher's batch, and is averaged, scored greedily and exported in int8."""
    student, distilled = teacher.with_name(teacher.name + "-student"), teacher.with_name(teacher.name + "-distilled")
    hyp = student / f"{TEST.name}.hyp.{TGT}"
    return [
        Step(f"distill: the teacher translates the training text (beam and n-best {s['DISTILL_BEAM']}, chrF selection; "
             f"resumes by chunk, one process per GPU)", args=[
            "distill", "--run-dir", teacher, "--checkpoint", "checkpoint_avg.pt", "--source", text / f"train.{SRC}",
            "--reference", text / f"train.{TGT}", "--beam", s["DISTILL_BEAM"], "--lenpen", flag_value(s["LENPEN"]),
            "-o", distilled, "--encoding-errors", s["ENCODING_ERRORS"], *threads]),
        Step(f"student: preprocess the distilled pair (joint BPE {s['VOCAB']})", args=[
            "preprocess", "--run-dir", student, "--source-lang", SRC, "--target-lang", TGT,
            "--trainpref", distilled / "train", "--validpref", text / VALID.name, "--testpref", text / TEST.name,
            "--vocab-size", s["VOCAB"], "--vocab-sample-lines", s["VOCAB_SAMPLE_LINES"], "--max-len", s["MAX_LEN"],
            "--max-ratio", flag_value(s["MAX_RATIO"]), *(["--workers", str(s["THREADS"])] if s["THREADS"] else [])]),
        Step(f"student: train --arch {s['STUDENT_ARCH']} on it with the teacher's batch", args=[
            "train", "--run-dir", student, "--arch", s["STUDENT_ARCH"], "--max-tokens", s["MAX_TOKENS"],
            "--update-freq", freq, "--warmup", s["WARMUP"], "--amp", s["AMP"], "--max-update", s["STUDENT_MAX_UPDATE"],
            "--save-interval-minutes", flag_value(s["SAVE_INTERVAL_MINUTES"]), "--keep-last", 5, "--no-epoch-checkpoints",
            "--log-interval", s["LOG_INTERVAL"], *(["--distributed-world-size", str(s["NUM_GPUS"])] if s["NUM_GPUS"] else []),
            *threads]),
        Step("student: average its last 5 interval checkpoints", prepare=fit_average({**s, "AVERAGE_LAST": 5}, student, "updates"),
             args=["average-checkpoints", "--run-dir", student, "--last", "5", "--kind", "updates"]),
        Step(f"student: translate {TEST.name} greedily (beam 1)", stdout=hyp, args=[
            "translate", "--run-dir", student, "--checkpoint", "checkpoint_avg.pt", "--input", text / f"{TEST.name}.{SRC}",
            "--beam", "1", *threads]),
        Step("student: score with sacreBLEU", stdout=student / f"{TEST.name}.sacrebleu.json", args=[
            "score", "--ref", text / f"{TEST.name}.{TGT}", "--hyp", hyp, "--lang", TGT, "--json"]),
        Step("student: export to CTranslate2 in int8, the CPU engine", args=[
            "export", "--run-dir", student, "--checkpoint", "checkpoint_avg.pt", "--quantization", "int8",
            "-o", student / "ctranslate2-int8", "--force"]),
    ]


def _need_matplotlib(run: Path):
    def prepare(step: Step) -> Optional[str]:
        import importlib.util

        (run / "learning_curves.png").unlink(missing_ok=True)
        if importlib.util.find_spec("matplotlib") is None:
            return "matplotlib is not installed (pip install 'nmt[plot]' to get learning_curves.png)"
        return None
    return prepare


def summarize(s: dict[str, Any], run: Path, hyp: Path, sacrebleu_json: Path, compound_json: Path) -> None:
    sacre = json.loads(sacrebleu_json.read_text(encoding="utf-8"))
    compound = json.loads(compound_json.read_text(encoding="utf-8"))
    stats = training_stats(run / "logs" / "train.jsonl")
    averaged, averaged_updates = averaged_from(run / "checkpoints" / "checkpoint_avg.pt")
    png = run / "learning_curves.png"
    summary = {
        "recipe": "wmt14_ende",
        "test_set": f"{TEST.name} ({sacre['lines']} lines; the full version has {FULL_TEST_LINES})",
        "run_dir": str(run),
        "bleu": round(sacre["bleu"], 2),
        "bleu_signature": sacre["signature"],
        "bleu_verbose": sacre["bleu_verbose"],
        "chrf": round(sacre["chrf"], 2),
        "chrf_signature": sacre["chrf_signature"],
        "compound_split_bleu": round(compound["bleu"], 2),
        "compound_split_bleu_verbose": compound["multi_bleu"],
        "hypotheses": str(hyp),
        "checkpoint": "checkpoint_avg.pt",
        "averaged_from": averaged,
        "averaged_updates": averaged_updates,
        "averaging_note": s.get("AVERAGING_NOTE"),
        **stats,
        "learning_curves": str(png) if png.is_file() else None,
        "settings": {**{k: s[k] for k in TRAINING}, **{k: s[k] for k in DECODING}},
    }
    write_json(run / "summary.json", summary)
    tps = f"{stats['target_tokens_per_s']:,.0f} target tokens/s" if stats["target_tokens_per_s"] else "tokens/s not logged"
    print(f"\n=== WMT14 en->de {TEST.name} ({sacre['lines']} lines), arch {s['ARCH']}, "
          f"average of {len(averaged)} checkpoint(s) (updates {', '.join(map(str, averaged_updates))})")
    print(f"sacreBLEU             {summary['bleu']:6.2f}  {sacre['signature']}")
    print(f"chrF                  {summary['chrf']:6.2f}  {sacre['chrf_signature']}")
    print(f"compound-split BLEU   {summary['compound_split_bleu']:6.2f}  tokenized, the paper's metric "
          f"(paper: 28.4 big, 27.3 base); not comparable to sacreBLEU")
    print(f"training: {format_duration(stats['train_time_s'])}, {stats['updates']} updates, "
          f"epoch {stats['epochs']}, {tps}")
    print(f"written: {run / 'summary.json'}, {hyp}" + (f", {png}" if png.is_file() else ""), flush=True)


def print_plan(s: dict[str, Any], gpus: int, freq: int, gpu_name: Optional[str]) -> None:
    roots = data_roots(s)
    print(f"WMT14 English->German, the paper's setup (Vaswani et al. 2017, Sections 5-6), in {s['RUN_DIR']}"
          + (" -- DRY RUN: nothing is executed" if s["DRY_RUN"] else ""))
    print("data:")
    for part in PARTS:
        role = "test " if part is TEST else "valid" if part is VALID else "train"
        paths = locate(part, roots)
        where = (f"{paths[0]} + {paths[1]}" if paths else
                 f"to fetch: {part.tarball_name} (from WMT14_DIR or {s['WMT14_URL']}{part.tarball})")
        print(f"  {role}  {part.name}: {where}")
    print(f"  training is about {train_pairs() / 1e6:.1f}M pairs ("
          + ", ".join(f"{p.name} {p.pairs / 1e6:.2f}M" for p in TRAIN_PARTS) + "); "
          f"test is newstest2014's full version, {FULL_TEST_LINES} lines (sacreBLEU's wmt14/full, which fairseq and "
          f"tensor2tensor score on), not the {FILTERED_TEST_LINES}-line filtered one (sacreBLEU's wmt14)")
    processes = max(1, gpus)
    origin = "NUM_GPUS" if s["NUM_GPUS"] else "torch.cuda.device_count()"
    device = (f"{gpus} GPU(s) ({origin})" if gpus else
              "no GPU visible: 1 CPU process (training needs ALLOW_CPU=1; NUM_GPUS=8 plans for 8 GPUs)")
    per_update = s["MAX_TOKENS"] * processes * freq
    print(f"devices: {device}")
    print(f"batch: about TOKENS_PER_UPDATE={s['TOKENS_PER_UPDATE']} source + {s['TOKENS_PER_UPDATE']} target tokens "
          f"per update (the paper: ~25000 + 25000 over 8 GPUs); MAX_TOKENS={s['MAX_TOKENS']} per GPU and side, so\n"
          f"  update-freq = max(1, round(TOKENS_PER_UPDATE / (MAX_TOKENS x GPUs))) = "
          f"round({s['TOKENS_PER_UPDATE']} / ({s['MAX_TOKENS']} x {processes})) = {freq}\n"
          f"  -> at most {s['MAX_TOKENS']} x {processes} x {freq} = {per_update} tokens per side per update "
          f"(padding included, so somewhat fewer real tokens)")
    print(f"schedule: {s['MAX_UPDATE']} updates, warmup {s['WARMUP']}, "
          + (f"peak lr {s['LR']}" if s["LR"] else "the paper's lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)")
          + f"; a checkpoint every {flag_value(s['SAVE_INTERVAL_MINUTES'])} minutes, the last {s['AVERAGE_LAST']} kept and averaged")
    print_disk(s)
    print_time(s, gpus, freq, per_update, gpu_name)


def settings() -> dict[str, Any]:
    s = settings_from_env({**TRAINING, **DECODING, **DISTILLATION, **SETUP})
    if s["NUM_GPUS"] is not None:
        s["NUM_GPUS"] = parse_setting("NUM_GPUS", s["NUM_GPUS"], 0)
    s["MAX_UPDATE"] = s["MAX_UPDATE"] or PAPER_STEPS.get(s["ARCH"], PAPER_STEPS["base"])
    s["AVERAGE_LAST"] = s["AVERAGE_LAST"] or PAPER_AVERAGE.get(s["ARCH"], PAPER_AVERAGE["base"])
    from nmt.model.config import ARCHS

    if s["ARCH"] not in ARCHS:
        raise RecipeError(f"ARCH={s['ARCH']} is not an architecture; known: {', '.join(ARCHS)}")
    if not 0 < s["GPU_SCALING"] <= 1:
        raise RecipeError(f"GPU_SCALING={s['GPU_SCALING']} is not a share of the single-GPU throughput; give one in (0, 1]")
    if not s["WMT14_URL"].endswith("/"):
        s["WMT14_URL"] += "/"
    if s["WMT14_DIR"] and not Path(s["WMT14_DIR"]).is_dir():
        raise RecipeError(f"WMT14_DIR={s['WMT14_DIR']} is not a directory; point it at the downloaded WMT14 files, or unset it to download them")
    return s


def main() -> None:
    s = settings()
    real_gpus = visible_gpus()
    if not s["DRY_RUN"] and real_gpus == 0 and not s["ALLOW_CPU"]:
        raise RecipeError(f"no GPU visible: training --arch {s['ARCH']} on this CPU would take months; run it on a GPU "
                          f"machine (DRY_RUN=1 shows the plan), or set ALLOW_CPU=1 to train on the CPU anyway")
    gpus = s["NUM_GPUS"] if s["NUM_GPUS"] else real_gpus
    freq = update_freq(s["TOKENS_PER_UPDATE"], s["MAX_TOKENS"], gpus)
    print_plan(s, gpus, freq, gpu_name())
    run_steps(build_steps(s, freq), s["DRY_RUN"])


if __name__ == "__main__":
    main_guard(PROG, main)
