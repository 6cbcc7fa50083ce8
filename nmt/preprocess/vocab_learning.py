"""Step 2 of preprocessing: learn the vocabulary from a uniform sample of cleaned training pairs,
or copy a given one after checking that it uses nmt's special ids."""

from __future__ import annotations

import json
import shutil
from itertools import chain, compress
from pathlib import Path
from typing import Any, Optional

import numpy as np

from nmt.preprocess.parallel_chunks import ChunkRunner, Job, Task, prepared_pairs, progress_bar, read_chunks
from nmt.preprocess.cleaning import DROP_REASONS, count_reasons, drop_codes, reasons_text
from nmt.errors import NmtError
from nmt.preprocess.config import PreprocessConfig
from nmt.data.textio import read_lines
from nmt.data.tokenizer import (BOS_ID, EOS_ID, MARIAN_VOCAB, PAD_ID, SPECIAL_TOKENS, UNK_ID, text_characters,
                                tokenizer_filename, train_tokenizer)
from nmt.preprocess.vocab_sample import UniformSample


def sample_chunk(task: Task) -> tuple[list[str], list[str], np.ndarray]:
    """Worker: the chunk's sampled pairs that survive cleaning, and the drop codes."""
    src, tgt = prepared_pairs(task)
    codes = drop_codes(src, tgt, task[0].rules)
    keep = codes == 0
    return list(compress(src, keep)), list(compress(tgt, keep)), codes


def learn_vocabularies(cfg: PreprocessConfig, train: dict[str, Path], n_train: int, stage: Path,
                        runner: ChunkRunner, progress: bool) -> tuple[dict[str, Path], dict[str, Any]]:
    """Learn the vocabulary (or one per language) from a uniform sample of cleaned train pairs.

    The sample goes through scratch files so that each vocabulary reads it from disk, not
    from memory, and Moses tokenization (when on) runs once.
    """
    scratch = stage / "scratch"
    scratch.mkdir()
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    job = Job(src_path=str(train[src_lang]), tgt_path=str(train[tgt_lang]), source_lang=src_lang,
               target_lang=tgt_lang, errors=cfg.encoding_errors, moses=cfg.moses, rules=cfg.rules(), clean=True)
    sample = UniformSample(n_train, cfg.vocab_sample_lines, cfg.seed)
    sample_files = {src_lang: scratch / f"sample.{src_lang}", tgt_lang: scratch / f"sample.{tgt_lang}"}
    sampled, used = 0, 0
    dropped = {reason: 0 for reason in DROP_REASONS}
    with open(sample_files[src_lang], "wb") as fs, open(sample_files[tgt_lang], "wb") as ft, \
            progress_bar(min(n_train, cfg.vocab_sample_lines), "read the vocabulary sample", progress) as bar:
        for src, tgt, codes in runner.map(sample_chunk, read_chunks(job, n_train, sample)):
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
    def characters(*langs: str) -> Optional[set[str]]:
        """WordPiece's alphabet, read from the scratch files rather than held in memory."""
        if cfg.vocab_type != "wordpiece":
            return None
        return text_characters(chain.from_iterable(read_lines(sample_files[lang]) for lang in langs))

    if cfg.joined:
        rel = Path("vocab") / tokenizer_filename(cfg.vocab_type, "joint")
        lines = chain(read_lines(sample_files[src_lang]), read_lines(sample_files[tgt_lang]))
        train_tokenizer(cfg.vocab_type, lines, cfg.vocab_size, stage / rel, cfg.character_coverage, threads,
                        characters(src_lang, tgt_lang))
        files = {src_lang: rel, tgt_lang: rel}
    else:
        files = {}
        for lang in (src_lang, tgt_lang):
            rel = Path("vocab") / tokenizer_filename(cfg.vocab_type, lang)
            try:
                train_tokenizer(cfg.vocab_type, read_lines(sample_files[lang]), cfg.vocab_size, stage / rel,
                                cfg.character_coverage, threads, characters(lang))
            except NmtError as e:
                raise NmtError(f"{lang} vocabulary: {e}") from None
            files[lang] = rel
    return files, {"sampled_pairs": sampled, "pairs_used": used, "dropped": dropped}


MARIAN_FILES = {"source": "source.spm", "target": "target.spm"}
"""An imported Marian vocabulary (`nmt import`): a SentencePiece model per side, one id table (MARIAN_VOCAB)."""


def marian_vocabulary(folder: Path) -> Optional[Path]:
    """The vocab/ folder of a run directory made by `nmt import` (or that folder itself), else None."""
    for candidate in (folder / "vocab", folder):
        if (candidate / MARIAN_VOCAB).is_file() and all((candidate / f).is_file() for f in MARIAN_FILES.values()):
            return candidate
    return None


def copy_vocabularies(cfg: PreprocessConfig, vocab_dir: Path) -> dict[str, Path]:
    """Copy the vocabulary given with --vocab into the staged vocab/ folder, after checking it.

    An imported Marian model's vocabulary (a run made by `nmt import`) is copied whole, its
    source.spm for the source language and target.spm for the target: --vocab-type and
    --joined do not apply to it (its two models share one id table)."""
    given = Path(cfg.vocab)
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    marian = marian_vocabulary(given) if given.is_dir() else None
    if marian is not None:
        imported = marian.parent / "config" / "preprocess.json"
        if imported.is_file():  # source.spm is the model's source language: the pair must be the model's
            record = json.loads(imported.read_text(encoding="utf-8"))
            pair = (record.get("source_lang"), record.get("target_lang"))
            if pair != (src_lang, tgt_lang):
                raise NmtError(f"--vocab {given} is the vocabulary of a {pair[0]}-{pair[1]} model, but this run is "
                               f"{src_lang}-{tgt_lang}; pass -s {pair[0]} -t {pair[1]}")
        if cfg.moses:
            raise NmtError(f"--vocab {given} is a Marian model's vocabulary, which reads raw text; drop --moses")
        vocab_dir.mkdir(parents=True)
        for name in (*MARIAN_FILES.values(), MARIAN_VOCAB):
            shutil.copyfile(marian / name, vocab_dir / name)
        return {src_lang: Path("vocab") / MARIAN_FILES["source"], tgt_lang: Path("vocab") / MARIAN_FILES["target"]}
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
        check_special_ids(path)
        rel = Path("vocab") / tokenizer_filename(cfg.vocab_type, name)
        shutil.copyfile(path, vocab_dir.parent / rel)
        files[name] = rel
    if cfg.joined:
        return {src_lang: files["joint"], tgt_lang: files["joint"]}
    return files


def check_special_ids(path: Path) -> None:
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
