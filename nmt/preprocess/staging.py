"""Staging and install: a preprocessing result appears in the run directory whole, or not at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from nmt.errors import NmtError
from nmt.preprocess.config import RECORD
from nmt.run.atomic import current_umask, fsync_directory
from nmt.run.replace import check_replaceable, holds_only
from nmt.run.directory import RunDir


STAGING_PREFIX = ".preprocess-tmp-"
RESULTS = {"vocab": (".model", ".json"), "data": (".bin", ".idx")}
"""The folders a preprocess replaces, and the only kinds of file it writes into them."""


def check_replaceable_results(root: Path) -> None:
    """Refuse (`nmt.run.replace`) to replace a vocab/ or data/ that holds anything preprocess does not
    write: `-r .` in a project whose data/ holds the corpora would otherwise delete them."""
    for name, suffixes in RESULTS.items():
        what = f"a {name}/ folder that holds only {' and '.join(suffixes)} files (what `nmt preprocess` writes)"
        check_replaceable(Path(root) / name, "--run-dir", what,
                          lambda folder, suffixes=suffixes: folder.is_dir() and holds_only(folder, lambda f: f.endswith(suffixes)))


def _staging_places(root: Path) -> tuple[Path, str]:
    """Where staging folders of `root` live: inside it when it exists, else beside it."""
    root = root.absolute()
    if root.is_dir():
        return root, STAGING_PREFIX
    return root.parent, f".{root.name}{STAGING_PREFIX}"


def remove_leftover_staging(root: Path) -> list[Path]:
    """Remove the staging folders a killed preprocess of `root` left behind; return them.

    Only called while holding the run directory's lock (`nmt.run.lock`): then no other
    preprocess of this run directory is running, and every staging folder is a leftover.
    """
    root = root.absolute()
    places = [(root, STAGING_PREFIX), (root.parent, f".{root.name}{STAGING_PREFIX}")]
    removed = []
    for folder, prefix in places:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name.startswith(prefix) and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
                removed.append(path)
    return removed


@contextmanager
def staging_dir(root: Path) -> Iterator[Path]:
    """A scratch folder on the run directory's filesystem, removed whatever happens.

    Inside the run directory when it exists; otherwise beside it (in its nearest existing
    ancestor), so that the run directory itself is only created by the final rename.
    """
    check_replaceable_results(root)  # before the work, so that a refusal costs nothing
    base, prefix = _staging_places(root)
    while not base.is_dir():
        base = base.parent
    try:
        stage = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    except OSError as e:
        raise NmtError(f"cannot write in {base}: {e.strerror}; choose another --run-dir") from None
    stage.chmod(0o777 & ~current_umask())  # mkdtemp's 0700 would otherwise become the run dir's mode
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def install(stage: Path, root: Path) -> None:
    """Move the staged vocab/, data/ and record into the run directory; the record goes last."""
    shutil.rmtree(stage / "scratch", ignore_errors=True)
    root = root.absolute()
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stage, root)
        fsync_directory(root.parent)
        return
    check_replaceable_results(root)  # again where it deletes: only what preprocess wrote goes
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
    fsync_directory(root)  # vocab/ and data/ are in place on disk before the record claims them
    os.replace(stage / "config" / f"{RECORD}.json", run.record_path(RECORD))
    fsync_directory(run.config_dir)
