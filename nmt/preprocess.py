"""`nmt preprocess`: raw parallel text -> subword vocabulary + binarized token ids in a run dir.

In the order the data flows:

1. Check every input before any heavy work: the files exist (`PREFIX.LANG` or `PREFIX.LANG.gz`),
   source and target have the same number of lines, and the run directory holds no result
   with other settings (same settings: nothing to do; other settings: refused without --force).
2. Learn the vocabulary (SentencePiece BPE as in the paper's En-De setup, SentencePiece
   unigram, or WordPiece as in its En-Fr setup) from a uniform sample of at most
   `vocab_sample_lines` cleaned training pairs; or copy an existing one (`--vocab`).
3. Binarize every split, streaming: chunks of lines go to worker processes that decode,
   optionally Moses-tokenize, clean (train only) and encode them (BPE word by word through a
   cache, `BpeWordCache`, with ids identical to SentencePiece's); the parent writes the ids in
   order to `data/{split}.{lang}.bin/.idx` (see `nmt.data`). Memory stays bounded by the
   chunk size times the number of chunks in flight, whatever the corpus size.
4. Move `vocab/`, `data/` and `config/preprocess.json` into the run directory only when
   everything succeeded; on any error the staging folder is removed and the run directory is
   left exactly as it was (and is not created if it did not exist).

Cleaning (train only) follows Moses' clean-corpus-n (`nmt.cleaning`). Valid and test sets are
never filtered: their empty lines stay as empty sentences, and the summary counts the pairs
that would have been dropped.

Normalization, i.e. what decoding the stored ids gives back for an input line:
  - SentencePiece (bpe, unigram): NFKC ("nmt_nfkc"), runs of whitespace collapsed to one
    space, leading and trailing whitespace removed.
  - WordPiece: NFKC, leading and trailing whitespace removed.
  - Characters the vocabulary does not cover become <unk> (decoded as " ⁇ " by SentencePiece,
    "<unk>" by WordPiece, which maps a whole word with an unknown character to <unk>); with
    `character_coverage` 1.0 only characters unseen in the sampled training data do.
  - With `--moses`, the stored ids decode to the Moses-normalized, tokenized text;
    `nmt.moses.moses_postprocess` detokenizes it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from itertools import chain, compress, islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from nmt.cleaning import DROP_REASONS, CleaningRules, count_reasons, drop_codes
from nmt.data import TokenArrayWriter, split_paths, token_dtype
from nmt.errors import NmtError
from nmt.rundir import RunDir
from nmt.textio import count_lines, decode_block, open_binary, read_lines
from nmt.tokenizer import (BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, VOCAB_TYPES, SentencePieceTokenizer,
                           load_tokenizer, tokenizer_filename, train_tokenizer)

RECORD = "preprocess"
CHUNK_LINES = 10_000
"""Lines per chunk sent to a worker: large enough to amortize IPC, small enough for flat memory."""
ENCODING_ERRORS = ("strict", "replace")
NORMALIZATION = (
    "SentencePiece (bpe, unigram): NFKC, whitespace runs collapsed, ends stripped; "
    "WordPiece: NFKC, ends stripped; uncovered characters become <unk>; "
    "with moses: the ids decode to Moses-normalized, tokenized text (nmt.moses.moses_postprocess undoes it)"
)


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class PreprocessConfig:
    """Every `nmt preprocess` setting; the CLI flags, `--help` and the record come from here."""

    source_lang: str = _f("", "Source language: input files are PREFIX.SRC (or PREFIX.SRC.gz), e.g. en.")
    target_lang: str = _f("", "Target language: input files are PREFIX.TGT (or PREFIX.TGT.gz), e.g. de.")
    trainpref: Optional[str] = _f(None, "Training data prefix (required unless --vocab is given).")
    validpref: Optional[str] = _f(None, "Validation data prefix (split 'valid'; never filtered).")
    testpref: Optional[str] = _f(None, "Test data prefixes, comma-separated: splits test, test1, test2, ... (never filtered).")
    vocab_type: str = _f("bpe", "bpe (SentencePiece BPE: the paper's En-De setup), unigram (SentencePiece unigram LM) "
                         "or wordpiece (WordPiece: the paper's En-Fr setup).")
    vocab_size: int = _f(8000, "Subword vocabulary size (paper: about 37000 shared BPE pieces for WMT14 En-De, "
                         "32000 word-pieces for En-Fr; 8000 suits Multi30k).")
    joined: bool = _f(True, "One vocabulary for both languages (needed to share all embeddings, paper 3.4); "
                      "--no-joined learns one per language.")
    vocab: Optional[str] = _f(None, "Reuse this vocabulary instead of learning one: a tokenizer file (.model or .json; "
                              "both sides) or a folder or run dir holding joint.* or SRC.* and TGT.*.")
    vocab_sample_lines: int = _f(10_000_000, "Learn the vocabulary from at most this many training pairs (lines "
                                 "per file), sampled uniformly (with --seed) when there are more.")
    character_coverage: float = _f(1.0, "Share of characters SentencePiece must cover (1.0 for Latin scripts, "
                                   "0.9995 for large character sets).")
    moses: bool = _f(False, "Moses punctuation normalization and tokenization (sacremoses) before everything else; "
                     "`nmt translate` undoes it.")
    min_len: int = _f(1, "Drop training pairs with a side of fewer whitespace words (clean-corpus-n min).")
    max_len: int = _f(250, "Drop training pairs with a side of more whitespace words (clean-corpus-n max; "
                      "fairseq's WMT14 script: 250).")
    max_ratio: float = _f(9.0, "Drop training pairs whose longer side has more than this many times the words of the "
                          "other (clean-corpus-n default 9; fairseq's WMT14 script: 1.5).")
    encoding_errors: str = _f("strict", "strict: invalid UTF-8 is an error naming file and line; "
                              "replace: substitute U+FFFD and go on.")
    seed: int = _f(1, "Seed of the uniform sample of training pairs the vocabulary is learned from.")
    workers: int = _f(0, "Worker processes for tokenization (0: all cores); does not change the result.")

    @classmethod
    def help(cls, name: str) -> str:
        """The `--help` text of a setting."""
        return next(f.metadata["help"] for f in fields(cls) if f.name == name)

    def test_prefixes(self) -> list[str]:
        return [p.strip() for p in (self.testpref or "").split(",") if p.strip()]

    def split_prefixes(self) -> dict[str, str]:
        """{split name: prefix}, named as fairseq does: train, valid, test, test1, test2, ..."""
        splits = {}
        if self.trainpref:
            splits["train"] = self.trainpref
        if self.validpref:
            splits["valid"] = self.validpref
        for i, prefix in enumerate(self.test_prefixes()):
            splits["test" if i == 0 else f"test{i}"] = prefix
        return splits

    def effective_workers(self) -> int:
        if self.workers > 0:
            return self.workers
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1

    def rules(self) -> CleaningRules:
        return CleaningRules(min_len=self.min_len, max_len=self.max_len, max_ratio=self.max_ratio)

    def validate(self) -> None:
        """Check the settings alone, before touching any file."""
        for flag, lang in (("--source-lang/-s", self.source_lang), ("--target-lang/-t", self.target_lang)):
            if not lang:
                raise NmtError(f"{flag} is required (the file suffix of that language, e.g. en)")
            if not all(c.isalnum() or c in "-_" for c in lang):
                raise NmtError(f"{flag} {lang!r} may only hold letters, digits, '-' and '_'")
        if self.source_lang == self.target_lang:
            raise NmtError(f"--source-lang and --target-lang are both {self.source_lang!r}; they must differ")
        if self.vocab_type not in VOCAB_TYPES:
            raise NmtError(f"unknown --vocab-type {self.vocab_type!r}; choose one of {', '.join(VOCAB_TYPES)}")
        if self.encoding_errors not in ENCODING_ERRORS:
            raise NmtError(f"unknown --encoding-errors {self.encoding_errors!r}; choose strict or replace")
        if not self.split_prefixes():
            raise NmtError("no input given; pass --trainpref (and --validpref, --testpref)")
        if not self.trainpref and not self.vocab:
            raise NmtError("--trainpref is required to learn a vocabulary (or pass --vocab to reuse one)")
        if self.vocab_size <= len(SPECIAL_TOKENS):
            raise NmtError(f"--vocab-size must be more than the {len(SPECIAL_TOKENS)} special tokens, got {self.vocab_size}")
        if self.vocab_sample_lines < 1:
            raise NmtError(f"--vocab-sample-lines must be at least 1, got {self.vocab_sample_lines}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise NmtError(f"--character-coverage must be in (0, 1], got {self.character_coverage}")
        if self.min_len < 0 or self.max_len < max(self.min_len, 1):
            raise NmtError(f"need 0 <= --min-len <= --max-len and --max-len >= 1, got {self.min_len} and {self.max_len}")
        if self.max_ratio < 1.0:
            raise NmtError(f"--max-ratio must be at least 1, got {self.max_ratio}")
        if self.workers < 0:
            raise NmtError(f"--workers must be 0 (all cores) or more, got {self.workers}")

    def settings(self) -> dict[str, Any]:
        """The settings that determine the result (paths made absolute; `workers` left out)."""
        s = asdict(self)
        del s["workers"]
        for key in ("trainpref", "validpref", "vocab"):
            if s[key]:
                s[key] = str(Path(s[key]).absolute())
        if self.testpref:
            s["testpref"] = ",".join(str(Path(p).absolute()) for p in self.test_prefixes())
        return s


@dataclass
class PreprocessResult:
    """What `run_preprocess` did: the record it wrote (or found), and notes for the user."""

    record: dict[str, Any]
    skipped: bool = False
    notes: list[str] = field(default_factory=list)


def run_preprocess(run_dir: str | os.PathLike, cfg: PreprocessConfig, force: bool = False,
                   progress: bool = True) -> PreprocessResult:
    """Preprocess `cfg`'s corpora into `run_dir` (see the module docstring for the steps)."""
    cfg.validate()
    run = RunDir(Path(run_dir))
    # 1. Inputs and run directory, before any heavy work.
    inputs = resolve_inputs(cfg)
    pairs = check_line_counts(inputs)
    settings = cfg.settings()
    fingerprints = input_fingerprints(inputs)
    existing = _existing_result(run, settings, fingerprints, force)
    if existing is not None:
        return PreprocessResult(existing, skipped=True,
                                notes=[f"{run.root} is already preprocessed with the same settings; nothing to do"])
    notes = []
    if force and run.checkpoint_dir.is_dir() and any(run.checkpoint_dir.iterdir()):
        notes.append(f"{run.checkpoint_dir} holds checkpoints trained on the previous data and vocabulary")

    try:
        record = _preprocess_into(run, cfg, inputs, pairs, settings, fingerprints, progress)
    finally:
        _WORKER_ENCODERS.clear()  # the in-process "worker" (workers=1) cached the staged tokenizers
    return PreprocessResult(record, skipped=False, notes=notes)


def _preprocess_into(run: RunDir, cfg: PreprocessConfig, inputs: dict[str, dict[str, Path]], pairs: dict[str, int],
                     settings: dict[str, Any], fingerprints: dict[str, list[int]], progress: bool) -> dict[str, Any]:
    """Steps 2-4 in a staging folder that replaces the run directory's results only on success."""
    workers = cfg.effective_workers()
    with _staging_dir(run.root) as stage, _ChunkRunner(workers) as runner:
        # 2. Vocabulary.
        if cfg.vocab:
            vocab_files = _copy_vocabularies(cfg, stage / "vocab")
            vocab_summary: dict[str, Any] = {"copied_from": str(Path(cfg.vocab).absolute())}
        else:
            vocab_files, vocab_summary = _learn_vocabularies(cfg, inputs["train"], pairs["train"], stage, runner, progress)
        tokenizers = {lang: load_tokenizer(stage / rel) for lang, rel in vocab_files.items()}
        vocab_sizes = {lang: tok.vocab_size for lang, tok in tokenizers.items()}
        dtype = token_dtype(max(vocab_sizes.values()))

        # 3. Binarization, split by split.
        (stage / "data").mkdir()
        split_summaries = {}
        for split, paths in inputs.items():
            job = _Job(
                src_path=str(paths[cfg.source_lang]), tgt_path=str(paths[cfg.target_lang]),
                source_lang=cfg.source_lang, target_lang=cfg.target_lang,
                errors=cfg.encoding_errors, moses=cfg.moses, rules=cfg.rules(), clean=split == "train",
                src_vocab=str(stage / vocab_files[cfg.source_lang]), tgt_vocab=str(stage / vocab_files[cfg.target_lang]),
                vocab_type=cfg.vocab_type, dtype=dtype.str,
            )
            split_summaries[split] = _binarize_split(split, job, pairs[split], stage / "data", runner, progress)
        train = split_summaries.get("train")
        if train is not None and train["pairs"] == 0:
            raise NmtError(f"cleaning dropped all {train['pairs_in']} training pairs ({reasons_text(train['dropped'])}); "
                           f"check the data or loosen --min-len/--max-len/--max-ratio")

        # 4. Record, then move everything into place at once.
        record = {
            "source_lang": cfg.source_lang,
            "target_lang": cfg.target_lang,
            "vocab_type": cfg.vocab_type,
            "joined": cfg.joined,
            "vocab": {lang: str(rel) for lang, rel in vocab_files.items()},
            "vocab_sizes": vocab_sizes,
            "dtype": dtype.name,
            "moses": cfg.moses,
            "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
            "normalization": NORMALIZATION,
            "splits": {
                split: {"pairs": s["pairs"], "files": {lang: str(p) for lang, p in inputs[split].items()}}
                for split, s in split_summaries.items()
            },
            "settings": settings,
            "inputs": fingerprints,
            "summary": {"vocab": vocab_summary, "splits": split_summaries},
        }
        (stage / "config").mkdir()
        (stage / "config" / f"{RECORD}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _install(stage, run.root)
    return record


# -- 1. inputs and the run directory ---------------------------------------------------------

def find_input(prefix: str, lang: str, flag: str) -> Path:
    """`PREFIX.LANG`, else `PREFIX.LANG.gz`; neither is a user error naming both."""
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.is_file():
            return candidate.absolute()
    raise NmtError(f"file not found: {prefix}.{lang} (nor {prefix}.{lang}.gz); check {flag} and the language suffixes")


def resolve_inputs(cfg: PreprocessConfig) -> dict[str, dict[str, Path]]:
    """{split: {lang: file}} for every split and side, checking that each file exists."""
    flags = {"train": "--trainpref", "valid": "--validpref"}
    return {
        split: {lang: find_input(prefix, lang, flags.get(split, "--testpref")) for lang in (cfg.source_lang, cfg.target_lang)}
        for split, prefix in cfg.split_prefixes().items()
    }


def check_line_counts(inputs: dict[str, dict[str, Path]]) -> dict[str, int]:
    """{split: pairs}; both sides of a split must have the same, non-zero number of lines."""
    pairs = {}
    for split, paths in inputs.items():
        (src_lang, src), (tgt_lang, tgt) = paths.items()
        n_src, n_tgt = count_lines(src), count_lines(tgt)
        if n_src != n_tgt:
            raise NmtError(f"{split} files differ in length: {src} has {n_src} lines but {tgt} has {n_tgt}; "
                           f"they must be line-by-line translations")
        if n_src == 0:
            raise NmtError(f"{split} corpus is empty: {src} and {tgt} have no lines")
        pairs[split] = n_src
    return pairs


def input_fingerprints(inputs: dict[str, dict[str, Path]]) -> dict[str, list[int]]:
    """{file: [size, mtime_ns]}: tells a re-run whether the input files changed."""
    out = {}
    for paths in inputs.values():
        for path in paths.values():
            st = path.stat()
            out[str(path)] = [st.st_size, st.st_mtime_ns]
    return out


def _existing_result(run: RunDir, settings: dict[str, Any], fingerprints: dict[str, list[int]],
                     force: bool) -> Optional[dict[str, Any]]:
    """The existing record when it has the same settings and inputs; refuse other results without --force."""
    if run.root.exists() and not run.root.is_dir():
        raise NmtError(f"--run-dir {run.root} is a file, not a directory")
    if run.has_record(RECORD) and not force:
        old = run.read_record(RECORD)
        old_settings = old.get("settings", {})
        if old_settings != settings:
            changed = [f"{k} {old_settings.get(k)!r} -> {settings.get(k)!r}" for k in settings if old_settings.get(k) != settings.get(k)]
            raise NmtError(f"{run.root} is already preprocessed with other settings ({'; '.join(changed[:3])}); "
                           f"pass --force to replace it, or use another --run-dir")
        if old.get("inputs") != fingerprints:
            raise NmtError(f"{run.root} is already preprocessed from these files, but they changed since; "
                           f"pass --force to preprocess them again")
        missing = [p for p in _output_files(old) if not (run.root / p).is_file()]
        if missing:
            raise NmtError(f"{run.root / missing[0]} is missing from the preprocessed run directory; "
                           f"pass --force to preprocess again")
        return old
    if not force:
        for d in (run.vocab_dir, run.data_dir):
            if d.is_dir() and any(d.iterdir()):
                raise NmtError(f"{d} exists but {run.record_path(RECORD)} does not (an interrupted or foreign run?); "
                               f"pass --force to replace it, or use another --run-dir")
    return None


def _output_files(record: dict[str, Any]) -> list[str]:
    files = sorted(set(record.get("vocab", {}).values()))
    for split in record.get("splits", {}):
        for lang in (record["source_lang"], record["target_lang"]):
            files.extend(str(p) for p in split_paths(Path("data"), split, lang))
    return files


@contextmanager
def _staging_dir(root: Path) -> Iterator[Path]:
    """A scratch folder on the run directory's filesystem, removed whatever happens.

    Inside the run directory when it exists; otherwise beside it (in its nearest existing
    ancestor), so that the run directory itself is only created by the final rename.
    """
    root = root.absolute()
    if root.is_dir():
        base, prefix = root, ".preprocess-tmp-"
    else:
        base = root.parent
        while not base.is_dir():
            base = base.parent
        prefix = f".{root.name}.preprocess-tmp-"
    try:
        stage = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    except OSError as e:
        raise NmtError(f"cannot write in {base}: {e.strerror}; choose another --run-dir") from None
    umask = os.umask(0)
    os.umask(umask)
    stage.chmod(0o777 & ~umask)  # mkdtemp's 0700 would otherwise become the run dir's mode
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _install(stage: Path, root: Path) -> None:
    """Move the staged vocab/, data/ and record into the run directory; the record goes last."""
    shutil.rmtree(stage / "scratch", ignore_errors=True)
    root = root.absolute()
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stage, root)
        return
    run = RunDir(root)
    old = stage / "replaced"
    old.mkdir()
    # Drop the old record first: if we die half-way, no record claims the data that is there.
    if run.has_record(RECORD):
        os.replace(run.record_path(RECORD), old / f"{RECORD}.json")
    for name in ("vocab", "data"):
        if (root / name).exists():
            os.rename(root / name, old / name)
        os.rename(stage / name, root / name)
    run.config_dir.mkdir(exist_ok=True)
    os.replace(stage / "config" / f"{RECORD}.json", run.record_path(RECORD))


# -- chunks through worker processes -----------------------------------------------------------

@dataclass(frozen=True)
class _Job:
    """What a worker needs to process chunks of one split (small: sent with every chunk)."""

    src_path: str
    tgt_path: str
    source_lang: str
    target_lang: str
    errors: str
    moses: bool
    rules: CleaningRules
    clean: bool
    src_vocab: Optional[str] = None
    tgt_vocab: Optional[str] = None
    vocab_type: str = "bpe"
    dtype: str = "<u2"


# A chunk task: (job, 1-based number of its first line, source lines, target lines,
# line numbers when the lines are not consecutive (a sample), else None).
_Task = tuple[_Job, int, bytes, bytes, Optional[np.ndarray]]


def _init_worker() -> None:
    # The parent handles Ctrl-C and terminates the pool; HF tokenizers must not start its
    # thread pool in a forked child (one worker process = one core).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


class _ChunkRunner:
    """Runs chunk tasks in worker processes, results in order, few chunks in flight.

    `Pool.imap` would read the whole input ahead into its task queue; keeping at most two
    chunks per worker in flight bounds memory. With one worker, tasks run in this process.
    """

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = None
        if workers > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ctx.Pool(workers, initializer=_init_worker)

    def map(self, fn: Callable[[_Task], Any], tasks: Iterable[_Task]) -> Iterator[Any]:
        if self.pool is None:
            yield from map(fn, tasks)
            return
        pending: deque = deque()
        for task in tasks:
            pending.append(self.pool.apply_async(fn, (task,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __enter__(self) -> "_ChunkRunner":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pool is None:
            return
        if exc_type is None:
            self.pool.close()
        else:
            self.pool.terminate()
        self.pool.join()


def _read_chunks(job: _Job, expected: int, sample: Optional["_UniformSample"] = None) -> Iterator[_Task]:
    """Chunks of aligned lines of both files, as raw bytes (workers decode them)."""
    with open_binary(job.src_path) as fs, open_binary(job.tgt_path) as ft:
        start = 1
        while True:
            src = list(islice(fs, CHUNK_LINES))
            tgt = list(islice(ft, CHUNK_LINES))
            n_read = len(src)
            if n_read != len(tgt) or start - 1 + n_read > expected:
                raise NmtError(f"{job.src_path} or {job.tgt_path} changed while being read; run again")
            if n_read == 0:
                break
            linenos = None
            if sample is not None:
                mask = sample.take(n_read)
                if not mask.all():
                    linenos = start + np.flatnonzero(mask)
                    src, tgt = list(compress(src, mask)), list(compress(tgt, mask))
            if src:
                yield job, start, b"".join(src), b"".join(tgt), linenos
            start += n_read
        if start - 1 != expected:
            raise NmtError(f"{job.src_path} or {job.tgt_path} changed while being read; run again")


def _prepared_pairs(task: _Task) -> tuple[list[str], list[str]]:
    """Decode a chunk's lines (and Moses-tokenize them when asked)."""
    job, start, src_block, tgt_block, linenos = task
    src = decode_block(src_block, job.src_path, start, job.errors, linenos)
    tgt = decode_block(tgt_block, job.tgt_path, start, job.errors, linenos)
    if job.moses:
        from nmt.moses import moses_preprocess

        src, tgt = moses_preprocess(src, job.source_lang), moses_preprocess(tgt, job.target_lang)
    return src, tgt


# -- 2. vocabulary -------------------------------------------------------------------------------

class _UniformSample:
    """A uniform sample without replacement of `size` of `population` lines, drawn chunk by chunk.

    For each chunk, the number of sampled lines it holds is hypergeometric given what is left;
    the positions within the chunk are then uniform. Memory is one chunk's mask.
    """

    def __init__(self, population: int, size: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.population_left, self.size_left = population, min(size, population)

    def take(self, n: int) -> np.ndarray:
        mask = np.zeros(n, dtype=bool)
        n_in = min(n, self.population_left)
        if self.size_left >= self.population_left:
            mask[:n_in] = True
            k = n_in
        elif n_in > 0 and self.size_left > 0:
            if n_in == self.population_left:  # the last chunk holds all that is left to draw
                k = self.size_left
            else:
                k = int(self.rng.hypergeometric(n_in, self.population_left - n_in, self.size_left))
            mask[self.rng.choice(n_in, size=k, replace=False)] = True
        else:
            k = 0
        self.population_left -= n_in
        self.size_left -= k
        return mask


def _sample_chunk(task: _Task) -> tuple[list[str], list[str], np.ndarray]:
    """Worker: the chunk's sampled pairs that survive cleaning, and the drop codes."""
    src, tgt = _prepared_pairs(task)
    codes = drop_codes(src, tgt, task[0].rules)
    keep = codes == 0
    return list(compress(src, keep)), list(compress(tgt, keep)), codes


def _learn_vocabularies(cfg: PreprocessConfig, train: dict[str, Path], n_train: int, stage: Path,
                        runner: _ChunkRunner, progress: bool) -> tuple[dict[str, Path], dict[str, Any]]:
    """Learn the vocabulary (or one per language) from a uniform sample of cleaned train pairs.

    The sample goes through scratch files so that each vocabulary reads it from disk, not
    from memory, and Moses tokenization (when on) runs once.
    """
    scratch = stage / "scratch"
    scratch.mkdir()
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    job = _Job(src_path=str(train[src_lang]), tgt_path=str(train[tgt_lang]), source_lang=src_lang,
               target_lang=tgt_lang, errors=cfg.encoding_errors, moses=cfg.moses, rules=cfg.rules(), clean=True)
    sample = _UniformSample(n_train, cfg.vocab_sample_lines, cfg.seed)
    sample_files = {src_lang: scratch / f"sample.{src_lang}", tgt_lang: scratch / f"sample.{tgt_lang}"}
    sampled, used = 0, 0
    dropped = {reason: 0 for reason in DROP_REASONS}
    with open(sample_files[src_lang], "wb") as fs, open(sample_files[tgt_lang], "wb") as ft, \
            _progress_bar(min(n_train, cfg.vocab_sample_lines), "read the vocabulary sample", progress) as bar:
        for src, tgt, codes in runner.map(_sample_chunk, _read_chunks(job, n_train, sample)):
            bar.update(len(codes))
            if src:
                fs.write(("\n".join(src) + "\n").encode("utf-8"))
                ft.write(("\n".join(tgt) + "\n").encode("utf-8"))
            sampled += len(codes)
            used += len(src)
            for reason, n in count_reasons(codes).items():
                dropped[reason] += n
    if used == 0:
        raise NmtError(f"cleaning dropped all {sampled} training pairs ({reasons_text(dropped)}); "
                       f"check the data or loosen --min-len/--max-len/--max-ratio")

    threads = runner.workers
    if cfg.joined:
        rel = Path("vocab") / tokenizer_filename(cfg.vocab_type, "joint")
        lines = chain(read_lines(sample_files[src_lang]), read_lines(sample_files[tgt_lang]))
        train_tokenizer(cfg.vocab_type, lines, cfg.vocab_size, stage / rel, cfg.character_coverage, threads)
        files = {src_lang: rel, tgt_lang: rel}
    else:
        files = {}
        for lang in (src_lang, tgt_lang):
            rel = Path("vocab") / tokenizer_filename(cfg.vocab_type, lang)
            try:
                train_tokenizer(cfg.vocab_type, read_lines(sample_files[lang]), cfg.vocab_size, stage / rel,
                                cfg.character_coverage, threads)
            except NmtError as e:
                raise NmtError(f"{lang} vocabulary: {e}") from None
            files[lang] = rel
    return files, {"sampled_pairs": sampled, "pairs_used": used, "dropped": dropped}


def _copy_vocabularies(cfg: PreprocessConfig, vocab_dir: Path) -> dict[str, Path]:
    """Copy the vocabulary given with --vocab into the staged vocab/ folder, after checking it."""
    given = Path(cfg.vocab)
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    if given.is_file():
        if not cfg.joined:
            raise NmtError(f"--vocab {given} is one file, but --no-joined needs one per language; "
                           f"pass a folder holding {tokenizer_filename(cfg.vocab_type, src_lang)} and "
                           f"{tokenizer_filename(cfg.vocab_type, tgt_lang)}")
        sources = {"joint": given}
    elif given.is_dir():
        folder = given / "vocab" if (given / "vocab").is_dir() else given
        names = ["joint"] if cfg.joined else [src_lang, tgt_lang]
        sources = {name: folder / tokenizer_filename(cfg.vocab_type, name) for name in names}
        for path in sources.values():
            if not path.is_file():
                raise NmtError(f"--vocab {given}: {path} not found (a {'joint' if cfg.joined else 'per-language'} "
                               f"{cfg.vocab_type} vocabulary is expected there)")
    else:
        raise NmtError(f"--vocab {given} not found; give a tokenizer file, a vocab/ folder or a run directory")

    vocab_dir.mkdir(parents=True)
    files = {}
    for name, path in sources.items():
        is_wordpiece = path.suffix == ".json"
        if is_wordpiece != (cfg.vocab_type == "wordpiece"):
            kind = "a WordPiece (.json)" if is_wordpiece else "a SentencePiece (.model)"
            raise NmtError(f"--vocab {path} is {kind} vocabulary, which does not match --vocab-type {cfg.vocab_type}")
        _check_special_ids(path)
        rel = Path("vocab") / tokenizer_filename(cfg.vocab_type, name)
        shutil.copyfile(path, vocab_dir.parent / rel)
        files[name] = rel
    if cfg.joined:
        return {src_lang: files["joint"], tgt_lang: files["joint"]}
    return files


def _check_special_ids(path: Path) -> None:
    """nmt's model and data assume pad=0 unk=1 bos=2 eos=3 in every vocabulary."""
    try:
        if path.suffix == ".json":
            from tokenizers import Tokenizer as HFTokenizer

            tok = HFTokenizer.from_file(str(path))
            ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
        else:
            import sentencepiece as spm

            sp = spm.SentencePieceProcessor(model_file=str(path))
            ids = [sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()]
    except Exception as e:  # a damaged or foreign file: say which
        raise NmtError(f"--vocab {path} is not a readable tokenizer model ({type(e).__name__}); "
                       f"give one written by `nmt preprocess`") from None
    if ids != [PAD_ID, UNK_ID, BOS_ID, EOS_ID]:
        raise NmtError(f"--vocab {path} has special ids {ids} for pad/unk/bos/eos, nmt needs "
                       f"{[PAD_ID, UNK_ID, BOS_ID, EOS_ID]}; use a vocabulary written by `nmt preprocess`")


# -- 3. binarization ---------------------------------------------------------------------------

@dataclass
class _Chunk:
    """A worker's result for one chunk: ids and statistics, never per-sentence Python objects."""

    pairs_in: int
    codes: np.ndarray
    src_ids: np.ndarray
    src_sizes: np.ndarray
    tgt_ids: np.ndarray
    tgt_sizes: np.ndarray


_WORKER_ENCODERS: dict[str, Any] = {}


def _worker_encoder(path: str, vocab_type: str) -> Any:
    """A worker loads each tokenizer once, single-threaded: the processes are the parallelism."""
    if path not in _WORKER_ENCODERS:
        tokenizer = load_tokenizer(path, num_threads=1)
        if vocab_type == "bpe" and isinstance(tokenizer, SentencePieceTokenizer):
            _WORKER_ENCODERS[path] = BpeWordCache(tokenizer.sp)
        else:
            _WORKER_ENCODERS[path] = _PlainEncoder(tokenizer)
    return _WORKER_ENCODERS[path]


class _PlainEncoder:
    """(flat ids, sizes) straight from the tokenizer's batched encode."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def encode(self, lines: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        return _flatten(self.tokenizer.encode(lines), dtype)


def _flatten(ids: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, sizes) of per-sentence id lists; the loops run in C (np.fromiter over chain)."""
    sizes = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(sizes.sum()))
    return flat, sizes


class BpeWordCache:
    """SentencePiece BPE encoding, word by word through a cache (as subword-nmt and HF do).

    SentencePiece BPE pieces never cross a word boundary ("▁" only starts a piece), and merges
    inside one word do not depend on the other words, so a sentence's ids are the
    concatenation of its normalized words' ids. Natural text repeats its words (Zipf), so most
    words come from the cache and SentencePiece only sees the new ones; a chunk is normalized
    in one call with a private-use separator between lines, so no Python loop runs per line or
    per token. The first chunk is also encoded whole and compared: a vocabulary where the two
    differ (a foreign model trained with other options) falls back to whole-sentence encoding.
    The cache is bounded (`max_words`), so memory does not grow with the corpus.
    """

    SEP = "\ue000"  # a private-use character: NFKC leaves it alone and it blocks composition

    def __init__(self, sp: Any, max_words: int = 200_000):
        self.sp = sp
        self.max_words = max_words
        self.dtype: Optional[np.dtype] = None
        self.cache: dict[str, bytes] = {}
        self.verified = False
        self.usable = hasattr(sp, "normalize") and all(
            "\u2581" not in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size()))

    def encode(self, lines: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        by_words = self._encode_by_words(lines, np.dtype(dtype)) if self.usable else None
        if by_words is not None and self.verified:
            return by_words
        whole = _flatten(self.sp.encode(lines, out_type=int, num_threads=1), dtype)
        if by_words is not None:
            self.verified = True
            if not (np.array_equal(by_words[0], whole[0]) and np.array_equal(by_words[1], whole[1])):
                self.usable = False
        return whole

    def _encode_by_words(self, lines: list[str], dtype: np.dtype) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """None when this chunk cannot be split safely (it holds the separator itself)."""
        sep = self.SEP
        if dtype != self.dtype:
            self.dtype, self.cache = dtype, {}
        if not lines:
            return np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.int64)
        text = sep.join(lines)
        if text.count(sep) != len(lines) - 1:
            return None
        normalized = self.sp.normalize(text)
        if normalized.count(sep) != len(lines) - 1:
            return None
        # "▁Two▁dogs<SEP>▁A▁cat" -> ["", "Two", "dogs", "", "<SEP>", "", "A", "cat"]
        tokens = normalized.replace(sep, f"\u2581{sep}\u2581").split("\u2581")
        cache = self.cache
        new = set(tokens).difference(cache)
        if new:
            if len(cache) + len(new) > self.max_words:
                cache.clear()
                new = set(tokens)
            new.discard("")
            new.discard(sep)
            # The separator becomes a pad id, which SentencePiece never emits: line ends are
            # then found with one vectorized comparison, not a loop over tokens.
            cache[""], cache[sep] = b"", np.array([PAD_ID], dtype=dtype).tobytes()
            new_words = list(new)
            ids = self.sp.encode(new_words, out_type=int, num_threads=1)
            cache.update(zip(new_words, (np.array(i, dtype=dtype).tobytes() for i in ids)))
        ids_and_ends = np.frombuffer(b"".join(map(cache.__getitem__, tokens)), dtype=dtype)
        is_end = ids_and_ends == PAD_ID
        ends = np.flatnonzero(is_end)
        sizes = np.diff(ends, prepend=-1, append=len(ids_and_ends)) - 1
        return ids_and_ends[~is_end], sizes


def _encode_chunk(task: _Task) -> _Chunk:
    """Worker: decode, (Moses), clean (train only) and encode one chunk of pairs."""
    job = task[0]
    src, tgt = _prepared_pairs(task)
    codes = drop_codes(src, tgt, job.rules)
    if job.clean and codes.any():
        keep = codes == 0
        src, tgt = list(compress(src, keep)), list(compress(tgt, keep))
    dtype = np.dtype(job.dtype)
    src_ids, src_sizes = _worker_encoder(job.src_vocab, job.vocab_type).encode(src, dtype)
    tgt_ids, tgt_sizes = _worker_encoder(job.tgt_vocab, job.vocab_type).encode(tgt, dtype)
    return _Chunk(len(codes), codes, src_ids, src_sizes, tgt_ids, tgt_sizes)


def _binarize_split(split: str, job: _Job, n_pairs: int, data_dir: Path, runner: _ChunkRunner,
                    progress: bool) -> dict[str, Any]:
    """Write `data/{split}.{lang}.bin/.idx` for both sides; return the split's statistics."""
    dtype = np.dtype(job.dtype)
    langs = (job.source_lang, job.target_lang)
    writers = [TokenArrayWriter(*split_paths(data_dir, split, lang), dtype) for lang in langs]
    codes_count = np.zeros(len(DROP_REASONS) + 1, dtype=np.int64)
    sentences, tokens, unk, empty = (np.zeros(2, dtype=np.int64) for _ in range(4))
    with _progress_bar(n_pairs, f"binarize {split}", progress) as bar:
        try:
            for chunk in runner.map(_encode_chunk, _read_chunks(job, n_pairs)):
                codes_count += np.bincount(chunk.codes.astype(np.int64), minlength=len(DROP_REASONS) + 1)
                for side, (ids, sizes) in enumerate(((chunk.src_ids, chunk.src_sizes), (chunk.tgt_ids, chunk.tgt_sizes))):
                    writers[side].add(ids, sizes)
                    sentences[side] += len(sizes)
                    tokens[side] += len(ids)
                    unk[side] += np.count_nonzero(ids == UNK_ID)
                    empty[side] += np.count_nonzero(sizes == 0)
                bar.update(chunk.pairs_in)
        finally:
            for w in writers:
                w.close()
    reasons = {reason: int(codes_count[i + 1]) for i, reason in enumerate(DROP_REASONS)}
    kept = int(sentences[0])
    summary: dict[str, Any] = {
        "pairs_in": n_pairs,
        "pairs": kept,
        "dropped": reasons if job.clean else {reason: 0 for reason in DROP_REASONS},
        # Valid and test are never filtered; these pairs break a cleaning rule but are kept.
        "kept_unfiltered": {reason: 0 for reason in DROP_REASONS} if job.clean else reasons,
        "sides": {
            lang: {
                "file": path,
                "sentences": int(sentences[side]),
                "tokens": int(tokens[side]),
                "unk": int(unk[side]),
                "unk_rate": float(unk[side] / tokens[side]) if tokens[side] else 0.0,
                "empty": int(empty[side]),
            }
            for side, (lang, path) in enumerate(zip(langs, (job.src_path, job.tgt_path)))
        },
    }
    return summary


def _progress_bar(total: int, desc: str, progress: bool) -> Any:
    """A tqdm bar on stderr when it is a terminal (disable=None), nothing in logs and pipes."""
    from tqdm import tqdm

    return tqdm(total=total, unit=" pairs", desc=desc, file=sys.stderr, disable=None if progress else True,
                unit_scale=True, dynamic_ncols=True, leave=False)


def reasons_text(reasons: dict[str, int]) -> str:
    """'too long 12, ratio 3' for a {reason: count} dict; 'none' when all are zero."""
    parts = [f"{reason.replace('_', ' ')} {n}" for reason, n in reasons.items() if n]
    return ", ".join(parts) if parts else "none"
