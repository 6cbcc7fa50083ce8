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
   order to `data/{split}.{lang}.bin/.idx` (see `nmt.data.token_arrays`). Memory stays bounded by the
   chunk size times the number of chunks in flight, whatever the corpus size.
4. Move `vocab/`, `data/` and `config/preprocess.json` into the run directory only when
   everything succeeded; on any error the staging folder is removed and the run directory is
   left exactly as it was (and is not created if it did not exist). A staging folder left by
   a killed run is removed by the next run (and named). The whole command holds the run
   directory's lock (`nmt.run.lock`): one writer at a time.

The modules, in that order: `nmt.preprocess.config` (settings), `nmt.preprocess.parallel_chunks`
(worker processes), `nmt.preprocess.vocab_sample` and `nmt.preprocess.vocab_learning` (step 2),
`nmt.preprocess.cached_bpe` (step 3's encoder), `nmt.preprocess.staging` (step 4), and
`nmt.preprocess.subword_sampling` (the sampled segmentations of `--subword-samples`).

Cleaning (train only) follows Moses' clean-corpus-n (`nmt.preprocess.cleaning`). Valid and test sets are
never filtered: their empty lines stay as empty sentences, and the summary counts the pairs
that would have been dropped.

Normalization, i.e. what decoding the stored ids gives back for an input line:
  - SentencePiece (bpe, unigram): NFKC ("nmt_nfkc"), runs of whitespace collapsed to one
    space, leading and trailing whitespace removed.
  - WordPiece: NFKC, leading and trailing whitespace removed.
  - Characters the vocabulary does not cover become <unk>, decoded as " ⁇ " by both kinds
    (WordPiece maps a whole word with an unknown character to one <unk>); with
    `character_coverage` 1.0 only characters unseen in the sampled training data do.
  - With `--moses`, the stored ids decode to the Moses-normalized, tokenized text;
    `nmt.data.moses.moses_postprocess` detokenizes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any, Optional

import numpy as np

from nmt.preprocess.cached_bpe import BpeWordCache, flatten
from nmt.preprocess.parallel_chunks import ChunkRunner, Job, Task, prepared_pairs, progress_bar, read_chunks
from nmt.preprocess.cleaning import DROP_REASONS, drop_codes, reasons_text
from nmt.data.token_arrays import TokenArrayWriter, split_paths, token_dtype
from nmt.errors import NmtError
from nmt.run.identity import vocab_hashes
from nmt.os_errors import naming
from nmt.preprocess.config import NORMALIZATION, RECORD, SETTINGS_ADDED, SETTINGS_REMOVED, PreprocessConfig
from nmt.preprocess.subword_sampling import METHODS, SegmentationSampler, chunk_seed, sample_split, sentencepiece_kind
from nmt.preprocess.staging import install, remove_leftover_staging, staging_dir
from nmt.run.directory import RunDir, check_run_dir_path
from nmt.run.lock import RunLock, command_line
from nmt.data.textio import count_lines
from nmt.data.tokenizer import MarianTokenizer, SentencePieceTokenizer, load_tokenizer
from nmt.preprocess.vocab_learning import copy_vocabularies, learn_vocabularies

__all__ = ["PreprocessConfig", "PreprocessResult", "run_preprocess", "reasons_text"]


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
    run = RunDir(check_run_dir_path(Path(run_dir)))
    # 1. Inputs and run directory, before any heavy work.
    inputs = resolve_inputs(cfg)
    pairs = check_line_counts(inputs)
    settings = cfg.settings()
    fingerprints = input_fingerprints(inputs)
    with RunLock(run.root, command_line()):
        notes = []
        leftovers = remove_leftover_staging(run.root)
        if leftovers:
            notes.append(f"removed {len(leftovers)} staging folder(s) left by an interrupted preprocess: "
                         f"{', '.join(map(str, leftovers))}")
        existing = _existing_result(run, settings, fingerprints, force)
        if existing is not None:
            notes.append(f"{run.root} is already preprocessed with the same settings; nothing to do")
            return PreprocessResult(existing, skipped=True, notes=notes)
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
    with staging_dir(run.root) as stage, ChunkRunner(workers) as runner:
        # 2. Vocabulary.
        if cfg.vocab:
            vocab_files = copy_vocabularies(cfg, stage / "vocab")
            vocab_summary: dict[str, Any] = {"copied_from": str(Path(cfg.vocab).absolute())}
        else:
            with naming(stage / "scratch"):  # where the vocabulary sample is written
                vocab_files, vocab_summary = learn_vocabularies(cfg, inputs["train"], pairs["train"], stage, runner, progress)
        tokenizers = {lang: load_tokenizer(stage / rel) for lang, rel in vocab_files.items()}
        vocab_sizes = {lang: tok.vocab_size for lang, tok in tokenizers.items()}
        special_ids = tokenizers[cfg.target_lang].special_ids
        marian = isinstance(tokenizers[cfg.target_lang], MarianTokenizer)
        vocab_type = "marian" if marian else cfg.vocab_type
        dtype = token_dtype(max(vocab_sizes.values()))
        sampling = _sampling_record(cfg, vocab_type, tokenizers) if cfg.subword_samples else None

        # 3. Binarization, split by split.
        (stage / "data").mkdir()
        split_summaries = {}
        for split, paths in inputs.items():
            job = Job(
                src_path=str(paths[cfg.source_lang]), tgt_path=str(paths[cfg.target_lang]),
                source_lang=cfg.source_lang, target_lang=cfg.target_lang,
                errors=cfg.encoding_errors, moses=cfg.moses, rules=cfg.rules(), clean=split == "train",
                src_vocab=str(stage / vocab_files[cfg.source_lang]), tgt_vocab=str(stage / vocab_files[cfg.target_lang]),
                vocab_type=cfg.vocab_type, dtype=dtype.str, unk_id=special_ids.unk,
                samples=cfg.subword_samples if split == "train" else 0, alpha=cfg.subword_alpha, seed=cfg.seed,
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
            "vocab_type": vocab_type,
            "joined": True if marian else cfg.joined,
            "vocab": {lang: str(rel) for lang, rel in vocab_files.items()},
            "vocab_sizes": vocab_sizes,
            # Which vocabulary, not only its size: checkpoints carry these (nmt.run.identity).
            "vocab_sha256": vocab_hashes(stage, {lang: str(rel) for lang, rel in vocab_files.items()}),
            "dtype": dtype.name,
            "moses": cfg.moses,
            "special_ids": special_ids._asdict(),  # the model's configuration copies them (nmt train)
            "normalization": NORMALIZATION,
            "splits": {
                split: {"pairs": s["pairs"], "files": {lang: str(p) for lang, p in inputs[split].items()}}
                for split, s in split_summaries.items()
            },
            **({"subword_sampling": sampling} if sampling else {}),
            "settings": settings,
            "inputs": fingerprints,
            "summary": {"vocab": vocab_summary, "splits": split_summaries},
        }
        (stage / "config").mkdir()
        record_path = stage / "config" / f"{RECORD}.json"
        with naming(record_path):
            record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        install(stage, run.root)
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
        old_settings = {**SETTINGS_ADDED, **old.get("settings", {})}
        for key, kept in SETTINGS_REMOVED.items():
            if old_settings.get(key) == kept:
                del old_settings[key]
        if old_settings != settings:
            changed = [f"{k} {old_settings.get(k)!r} -> {settings.get(k)!r}" for k in {**old_settings, **settings}
                       if old_settings.get(k) != settings.get(k)]
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
    for split in [*record.get("splits", {}), *record.get("subword_sampling", {}).get("splits", [])]:
        for lang in (record["source_lang"], record["target_lang"]):
            files.extend(str(p) for p in split_paths(Path("data"), split, lang))
    return files


def _sampling_record(cfg: PreprocessConfig, vocab_type: str, tokenizers: dict[str, Any]) -> dict[str, Any]:
    """What --subword-samples stores (the record's "subword_sampling"); refused for a vocabulary
    that cannot sample (WordPiece, also when given with --vocab)."""
    if vocab_type == "marian":
        raise NmtError("--subword-samples does not sample an imported Marian vocabulary yet (its pieces are numbered by "
                       "vocab.json); drop --subword-samples to fine-tune on the deterministic segmentation")
    if not all(isinstance(t, SentencePieceTokenizer) for t in tokenizers.values()):
        raise NmtError(f"--subword-samples needs a SentencePiece vocabulary, but this one is {vocab_type}: WordPiece "
                       f"cuts words by greedy longest match and has no segmentations to sample; drop --subword-samples "
                       f"or use a bpe or unigram vocabulary")
    kinds = sorted({sentencepiece_kind(t.sp) for t in tokenizers.values()})
    return {
        "samples": cfg.subword_samples,
        "alpha": cfg.subword_alpha,
        "method": "; ".join(METHODS[kind] for kind in kinds),
        "sides": "source",
        "seed": cfg.seed,
        "splits": [sample_split(k) for k in range(1, cfg.subword_samples + 1)],
        "epochs": "nmt train trains epoch e on sample ((e - 1) mod samples) + 1",
    }


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
    samples: list[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]] = field(default_factory=list)
    """Per sampled segmentation k = 1..K: ((src ids, sizes), (tgt ids, sizes))."""


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
        return flatten(self.tokenizer.encode(lines), dtype)


def _worker_sampler(path: str, alpha: float) -> SegmentationSampler:
    """A worker's segmentation sampler, loaded once per vocabulary."""
    key = f"{path}\0{alpha}"
    if key not in _WORKER_ENCODERS:
        _WORKER_ENCODERS[key] = SegmentationSampler(path, alpha)
    return _WORKER_ENCODERS[key]


def _encode_chunk(task: Task) -> _Chunk:
    """Worker: decode, (Moses), clean (train only) and encode one chunk of pairs, then its sampled
    source segmentations (seeded per chunk and sample: the same whichever worker runs it); the
    samples' target side is the deterministic one."""
    job, first_line = task[0], task[1]
    src, tgt = prepared_pairs(task)
    codes = drop_codes(src, tgt, job.rules)
    if job.clean and codes.any():
        keep = codes == 0
        src, tgt = list(compress(src, keep)), list(compress(tgt, keep))
    dtype = np.dtype(job.dtype)
    src_ids, src_sizes = _worker_encoder(job.src_vocab, job.vocab_type).encode(src, dtype)
    tgt_ids, tgt_sizes = _worker_encoder(job.tgt_vocab, job.vocab_type).encode(tgt, dtype)
    sampler = _worker_sampler(job.src_vocab, job.alpha) if job.samples else None
    samples = [(flatten(sampler.encode(src, chunk_seed(job.seed, k, 0, first_line)), dtype), (tgt_ids, tgt_sizes))
               for k in range(1, job.samples + 1)]
    return _Chunk(len(codes), codes, src_ids, src_sizes, tgt_ids, tgt_sizes, samples)


def _binarize_split(split: str, job: Job, n_pairs: int, data_dir: Path, runner: ChunkRunner,
                    progress: bool) -> dict[str, Any]:
    """Write `data/{split}.{lang}.bin/.idx` for both sides; return the split's statistics."""
    dtype = np.dtype(job.dtype)
    langs = (job.source_lang, job.target_lang)
    writers = [TokenArrayWriter(*split_paths(data_dir, split, lang), dtype) for lang in langs]
    sample_writers = [[TokenArrayWriter(*split_paths(data_dir, sample_split(k), lang), dtype) for lang in langs]
                      for k in range(1, job.samples + 1)]
    sample_tokens = np.zeros((job.samples, 2), dtype=np.int64)
    codes_count = np.zeros(len(DROP_REASONS) + 1, dtype=np.int64)
    sentences, tokens, unk, empty = (np.zeros(2, dtype=np.int64) for _ in range(4))
    with progress_bar(n_pairs, f"binarize {split}", progress) as bar:
        try:
            for chunk in runner.map(_encode_chunk, read_chunks(job, n_pairs)):
                codes_count += np.bincount(chunk.codes.astype(np.int64), minlength=len(DROP_REASONS) + 1)
                for side, (ids, sizes) in enumerate(((chunk.src_ids, chunk.src_sizes), (chunk.tgt_ids, chunk.tgt_sizes))):
                    with naming(writers[side].bin_path):  # a full disk names the file, not "standard output"
                        writers[side].add(ids, sizes)
                    sentences[side] += len(sizes)
                    tokens[side] += len(ids)
                    unk[side] += np.count_nonzero(ids == job.unk_id)
                    empty[side] += np.count_nonzero(sizes == 0)
                for k, sides in enumerate(chunk.samples):
                    for side, (ids, sizes) in enumerate(sides):
                        with naming(sample_writers[k][side].bin_path):
                            sample_writers[k][side].add(ids, sizes)
                        sample_tokens[k, side] += len(ids)
                bar.update(chunk.pairs_in)
        finally:
            for w in [*writers, *(w for pair in sample_writers for w in pair)]:
                with naming(w.bin_path):
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
    if job.samples:  # sampled segmentations are longer: what an epoch on each costs
        summary["samples"] = {sample_split(k + 1): {lang: int(sample_tokens[k, side]) for side, lang in enumerate(langs)}
                              for k in range(job.samples)}
    return summary
