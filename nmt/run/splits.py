"""The raw text of a split that `nmt preprocess` recorded, so `nmt translate --subset test`
and `nmt score --subset test` need no paths typed again (as fairseq's --gen-subset).

config/preprocess.json lists, per split, the absolute paths of its raw source and target
files ("splits": {"test": {"files": {"en": ..., "de": ...}}}); those are what the user gave
preprocess, before Moses or subword tokenization, so they are what translate reads and what
score compares with.
"""

from __future__ import annotations

from pathlib import Path

from nmt.errors import NmtError
from nmt.run.directory import RunDir


def split_text_file(run_dir: str | Path, subset: str, side: str) -> Path:
    """The raw file of `subset` ("test", "valid", ...) on `side` ("source" or "target")."""
    run = RunDir(Path(run_dir))
    record = run.read_record("preprocess")
    splits = record.get("splits", {})
    if subset not in splits:
        known = ", ".join(sorted(splits)) or "none"
        raise NmtError(f"{run.root} has no split {subset!r} (preprocessed splits: {known}); "
                       f"pass --testpref to `nmt preprocess`, or give the file itself")
    lang = record["source_lang"] if side == "source" else record["target_lang"]
    files = splits[subset].get("files", {})
    if lang not in files:
        raise NmtError(f"{run.record_path('preprocess')} does not name the raw {lang} file of split {subset!r}; "
                       f"re-run `nmt preprocess --force`, or give the file itself")
    path = Path(files[lang])
    if not path.is_file():
        raise NmtError(f"the raw {lang} file of split {subset!r}, {path}, is gone; "
                       f"put it back, or give the file itself")
    return path


def target_lang(run_dir: str | Path) -> str:
    """The run's target language (sacreBLEU picks its tokenizer from it)."""
    return RunDir(Path(run_dir)).read_record("preprocess")["target_lang"]
