"""`nmt distill`: a teacher translates a corpus into a student's training pair, in chunks.

At WMT scale this is the longest step of a student's making (hours of GPU per million lines), so
the corpus is cut into chunks of --chunk-lines lines, each translated on its own and saved
atomically (OUT/chunks/NNNNNN.*, its counts last, as the mark that it is done): a run killed
midway and started again skips the finished chunks, and since a chunk's output depends only on
its own lines (and, when sampling, on --seed plus its index), the result is byte-identical to an
unbroken run's, on one process or many. Chunk k goes to process k mod P: --workers local
processes (one per visible GPU by default), or torchrun's ranks across nodes; whichever finds
every chunk done joins them into OUT/train.SRC and OUT/train.TGT, line-aligned with the input.

A line that gives the student nothing to learn keeps its place with an empty target, which
`nmt preprocess` drops: an empty source, a source longer than the teacher's positions (its
translation would cover a cut), a line the search found no hypothesis for. OUT/summary.json
counts each.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Optional, Sequence

from nmt.distill.selection import SELECTIONS, select
from nmt.errors import NmtError
from nmt.settings import MAX_THREADS, POSITIVE, Range, check_ranges, setting

MANIFEST = "distill.json"
SUMMARY = "summary.json"


@dataclass
class DistillConfig:
    select: str = setting("chrf", "Which n-best hypothesis becomes the target: chrf, the highest sentence chrF against "
                                  "--reference (Mozilla's Firefox Translations pipeline); best, the teacher's top one "
                                  "(Kim and Rush 2016; taken without a --reference).")
    chunk_lines: int = setting(10000, "Lines per chunk: the unit that is saved, resumed and shared among processes.")
    workers: int = setting(0, "Processes translating chunks: 0 (auto) one per visible GPU, else 1. Several on a CPU "
                              "share --threads (default: the cores). Under torchrun each rank is one more process.")

    RANGES: ClassVar[dict[str, Range]] = {"chunk_lines": POSITIVE, "workers": Range(0, MAX_THREADS)}

    def validate(self) -> None:
        check_ranges(self)
        if self.select not in SELECTIONS:
            raise NmtError(f"--select must be one of {', '.join(SELECTIONS)}, not {self.select!r}")


@dataclass
class Job:
    """Everything a process needs to translate its chunks (plain data: it crosses to the worker processes)."""

    run_dir: str
    checkpoints: list[str]
    source: str
    reference: Optional[str]
    out: str
    target_lang: str
    search: Any
    translate: Any
    sampling: Any
    distill: DistillConfig
    lines: int
    announce: bool = False
    """Say the teacher's checkpoints and decoder on stderr (one process of the job does)."""

    @property
    def chunks(self) -> int:
        return math.ceil(self.lines / self.distill.chunk_lines)

    def chunk_path(self, k: int, suffix: str) -> Path:
        return Path(self.out) / "chunks" / f"{k:06d}.{suffix}"

    def done(self, k: int) -> bool:
        return self.chunk_path(k, "json").is_file()


def distill(run_dir: str | Path, source: str | Path, out: str | Path, *, reference: Optional[str | Path] = None,
            checkpoints: Sequence[str | Path] = (), search: Any = None, translate: Any = None, sampling: Any = None,
            config: Optional[DistillConfig] = None, progress: bool = True, say: Callable[[str], None] = lambda m: None) -> dict:
    """Translate `source` with the teacher in `run_dir` into OUT/train.SRC and OUT/train.TGT,
    resuming whatever an earlier run with the same inputs and settings finished; returns the summary."""
    from nmt.inference.config import SearchConfig, TranslateConfig
    from nmt.inference.sampling_config import SamplingConfig
    from nmt.run.atomic import write_json
    from nmt.run.directory import RunDir

    search, translate = search or SearchConfig(), translate or TranslateConfig()
    sampling, config = sampling or SamplingConfig(), config or DistillConfig()
    config.validate()
    record = RunDir(Path(run_dir)).read_record("preprocess")
    src_lang, tgt_lang = record["source_lang"], record["target_lang"]
    if sampling.sampling and search.nbest > 1:
        raise NmtError("--sampling draws one translation per line; drop --nbest")
    if config.select == "chrf" and reference is not None and search.nbest < 2:
        raise NmtError("--select chrf picks among the n-best: give --nbest 2 or more (Mozilla: --beam 8 --nbest 8), "
                       "or --select best")
    lines, source_digest = _scan(Path(source), "--source")
    manifest: dict[str, Any] = {
        "teacher": str(Path(run_dir).resolve()), "checkpoints": [str(c) for c in checkpoints],
        "source": {"path": str(Path(source).resolve()), "lines": lines, "sha256": source_digest},
        "search": asdict(search), "sampling": asdict(sampling), "distill": {"select": config.select, "chunk_lines": config.chunk_lines},
        "languages": [src_lang, tgt_lang],
    }
    if reference is not None:
        ref_lines, ref_digest = _scan(Path(reference), "--reference")
        if ref_lines != lines:
            raise NmtError(f"--source {source} has {lines} lines but --reference {reference} has {ref_lines}; "
                           f"give the two sides of one parallel corpus")
        manifest["reference"] = {"path": str(Path(reference).resolve()), "lines": ref_lines, "sha256": ref_digest}
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NmtError(f"-o {out} is a file; give a folder for the distilled pair")
    _check_or_write_manifest(out, manifest, write_json)
    job = Job(str(Path(run_dir)), [str(c) for c in checkpoints], str(source), None if reference is None else str(reference),
              str(out), tgt_lang, search, translate, sampling, config, lines, announce=progress)
    left = [k for k in range(job.chunks) if not job.done(k)]
    if len(left) < job.chunks:
        say(f"resuming: {job.chunks - len(left)} of {job.chunks} chunks already done in {out}")
    rank, world = _torchrun_rank()
    if world > 1:
        _translate_chunks(job, rank, world, _bar(job, progress))
    elif left:
        workers = _workers(config, translate)
        if workers > 1:
            _run_workers(job, workers, progress)
        else:
            _translate_chunks(job, 0, 1, _bar(job, progress))
    if not all(job.done(k) for k in range(job.chunks)):  # another torchrun rank still works
        say(f"rank {rank}: its chunks are done; the rank that finishes last joins them")
        return {}
    joined = [out / SUMMARY, out / f"train.{src_lang}", out / f"train.{tgt_lang}"]
    if all(p.is_file() for p in joined):  # done before: its files stay as they are (and their times)
        summary = json.loads(joined[0].read_text(encoding="utf-8"))
        return {**summary, "source": str(joined[1]), "target": str(joined[2])}  # where they are now, if moved
    return _join(job, src_lang, tgt_lang)


def _scan(path: Path, flag: str) -> tuple[int, str]:
    """Line count and SHA-256 of a text file (plain or .gz), in one read."""
    from nmt.data.textio import open_binary

    if not path.is_file():
        raise NmtError(f"{flag} {path}: no such file")
    digest, lines, last = hashlib.sha256(), 0, b"\n"
    with open_binary(path) as f:
        while block := f.read(1 << 20):
            digest.update(block)
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n"), digest.hexdigest()


def _check_or_write_manifest(out: Path, manifest: dict, write_json: Callable[[Path, Any], None]) -> None:
    """A folder's chunks belong to one set of inputs and settings: resume only that one."""
    path = out / MANIFEST
    if path.is_file():
        before = json.loads(path.read_text(encoding="utf-8"))
        differ = sorted(k for k in set(before) | set(manifest) if before.get(k) != manifest.get(k))
        if differ:
            raise NmtError(f"{out} holds a distillation of other inputs or settings (they differ in: {', '.join(differ)}); "
                           f"give a new -o, or remove {out} to start over")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, manifest)


def _torchrun_rank() -> tuple[int, int]:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return 0, 1


def _workers(config: DistillConfig, translate: Any) -> int:
    if config.workers:
        return config.workers
    import torch

    from nmt.device import resolve_device

    gpus = torch.cuda.device_count() if resolve_device(translate.device).type == "cuda" else 0
    return max(1, gpus)


def _bar(job: Job, progress: bool) -> Callable[[int], None]:
    """A progress bar with ETA over the lines still to translate; returns its update."""
    if not progress:
        return lambda n: None
    from tqdm import tqdm

    todo = sum(min(job.distill.chunk_lines, job.lines - k * job.distill.chunk_lines)
               for k in range(job.chunks) if not job.done(k))
    bars: list[tqdm] = []

    def advance(n: int) -> None:  # the bar starts at the first call: after the teacher's line on stderr
        if not bars:
            bars.append(tqdm(total=todo, unit=" lines", desc="nmt distill", file=sys.stderr, dynamic_ncols=True))
        bars[0].update(n)
    return advance


def _chunks(job: Job, rank: int, world: int) -> Iterator[tuple[int, list[str], Optional[list[str]]]]:
    """This process's unfinished chunks: (index, source lines, reference lines or None).
    Lines of other chunks are read, not decoded."""
    from itertools import zip_longest

    from nmt.data.textio import decode_line, open_binary

    size, errors = job.distill.chunk_lines, job.translate.encoding_errors
    with open_binary(job.source) as src, (open_binary(job.reference) if job.reference else open(os.devnull, "rb")) as ref:
        raw_ref = ref if job.reference else iter(())
        k, src_lines, ref_lines = 0, [], []
        for lineno, (s, r) in enumerate(zip_longest(src, raw_ref), 1):
            mine = k % world == rank and not job.done(k)
            if mine:
                src_lines.append(decode_line(s, job.source, lineno, errors).rstrip("\r\n"))
                if job.reference:
                    ref_lines.append(decode_line(r, job.reference, lineno, errors).rstrip("\r\n"))
            if lineno % size == 0 or lineno == job.lines:
                if mine:
                    yield k, src_lines, (ref_lines if job.reference else None)
                k, src_lines, ref_lines = k + 1, [], []


def _translate_chunks(job: Job, rank: int, world: int, advance: Callable[[int], None]) -> None:
    from nmt.inference.translator import load_translator
    from nmt.run.atomic import write_json, write_text

    translator = None
    for k, src_lines, ref_lines in _chunks(job, rank, world):
        if translator is None:
            from nmt.inference.translator import DECODER_PATHS

            translator = load_translator(job.run_dir, job.checkpoints, job.search, job.translate, job.sampling)
            if job.announce and rank == 0:
                print(f"nmt distill: {'checkpoint' if len(translator.checkpoints) == 1 else 'ensemble of'} "
                      f"{', '.join(map(str, translator.checkpoints))}; decoder {translator.decoder_path}: "
                      f"{DECODER_PATHS[translator.decoder_path]}", file=sys.stderr, flush=True)
            advance(0)
        generator = getattr(translator.decoder, "generator", None)
        if generator is not None:  # a chunk's draws depend on its index only: resumes and shards agree
            generator.manual_seed(job.sampling.seed + k)
        targets, counts = _distill_chunk(translator, src_lines, ref_lines, job.distill.select, job.translate.buffer_size)
        write_text(job.chunk_path(k, job.target_lang), "".join(t + "\n" for t in targets))
        write_json(job.chunk_path(k, "json"), counts)  # last: the mark that chunk k is done
        advance(len(src_lines))


def _distill_chunk(translator: Any, src_lines: list[str], ref_lines: Optional[list[str]], how: str,
                   buffer_size: int) -> tuple[list[str], dict[str, int]]:
    """One target line per source line and the counts of what was dropped and why."""
    targets = [""] * len(src_lines)
    counts = {"lines": len(src_lines), "kept": 0, "empty": 0, "too_long": 0, "no_hypothesis": 0}
    fits = translator.fits(src_lines)
    todo = []
    for i, (line, fit) in enumerate(zip(src_lines, fits)):
        if not line.strip():
            counts["empty"] += 1
        elif not fit:
            counts["too_long"] += 1
        else:
            todo.append(i)
    for start in range(0, len(todo), buffer_size):
        batch = todo[start:start + buffer_size]
        for i, translation in zip(batch, translator.translate([src_lines[i] for i in batch])):
            reference = ref_lines[i] if ref_lines is not None else None
            targets[i] = select(translation.nbest, reference, how).strip()
            if targets[i]:
                counts["kept"] += 1
            else:
                counts["no_hypothesis"] += 1
    return targets, counts


def _run_workers(job: Job, workers: int, progress: bool) -> None:
    """`workers` local processes, chunk k to worker k mod workers; their errors as one line."""
    from dataclasses import replace

    import torch

    from nmt.device import resolve_device, worker_processes

    ctx = worker_processes(__name__)
    done, errors = ctx.Value("q", 0), ctx.Queue()
    cuda = resolve_device(job.translate.device).type == "cuda"
    if cuda and workers > torch.cuda.device_count():
        raise NmtError(f"--workers {workers} but only {torch.cuda.device_count()} GPU(s) are visible")
    threads = max(1, (job.translate.threads or os.cpu_count() or 1) // workers)
    procs = [ctx.Process(target=_worker, args=(replace(job, translate=replace(
        job.translate, device=f"cuda:{rank}" if cuda else job.translate.device, threads=threads)), rank, workers, done, errors))
        for rank in range(workers)]
    for p in procs:
        p.start()
    advance, seen = _bar(job, progress), 0
    while any(p.is_alive() for p in procs) and not any(p.exitcode not in (None, 0) for p in procs):
        time.sleep(0.2)
        now = done.value
        if now > seen:
            advance(now - seen)
            seen = now
    failed = [(rank, p.exitcode) for rank, p in enumerate(procs) if p.exitcode not in (0, None)]
    for p in procs:
        if failed and p.is_alive():
            p.terminate()
        p.join()
    if done.value > seen:
        advance(done.value - seen)
    if failed:
        message = None if errors.empty() else errors.get()
        if message is not None:
            raise NmtError(message)
        rank, code = failed[0]
        raise NmtError(f"distill worker {rank} died (exit status {code}); the chunks it finished are kept: "
                       f"re-run the same command to continue")


def _worker(job: Job, rank: int, world: int, done: Any, errors: Any) -> None:
    def advance(n: int) -> None:
        with done.get_lock():
            done.value += n

    try:
        _translate_chunks(job, rank, world, advance)
    except NmtError as e:
        errors.put(str(e))
        sys.exit(1)


def _join(job: Job, src_lang: str, tgt_lang: str) -> dict:
    """OUT/train.SRC (the source, as read), OUT/train.TGT (the chunks' targets) and the summary."""
    from nmt.data.textio import read_lines
    from nmt.run.atomic import atomic_path, write_json

    out = Path(job.out)
    if src_lang == tgt_lang:
        raise NmtError(f"the teacher's source and target are both {src_lang!r}: the pair's files would share one name")
    with atomic_path(out / f"train.{src_lang}") as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in read_lines(job.source, job.translate.encoding_errors):
            f.write(line + "\n")
    with atomic_path(out / f"train.{tgt_lang}") as tmp, open(tmp, "wb") as f:
        for k in range(job.chunks):
            f.write(job.chunk_path(k, tgt_lang).read_bytes())
    totals = {"lines": 0, "kept": 0, "empty": 0, "too_long": 0, "no_hypothesis": 0}
    for k in range(job.chunks):
        for key, value in json.loads(job.chunk_path(k, "json").read_text()).items():
            totals[key] += value
    summary = {**totals, "source": str(out / f"train.{src_lang}"), "target": str(out / f"train.{tgt_lang}"),
               "select": job.distill.select if job.reference else "best", "chunks": job.chunks}
    write_json(out / SUMMARY, summary)
    return summary
