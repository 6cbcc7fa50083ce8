"""Atomic file writes: a temp file in the same folder, fsync, then rename.

A crash mid-write must never leave a half-written record or checkpoint where a later step
would read it; `os.replace` is atomic on POSIX within one filesystem.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from nmt.errors import NmtError


_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
"""The temp names `atomic_path` makes: ".NAME." + mkstemp's 8 random characters + ".tmp"."""


def remove_leftover_temps(folder: Path) -> list[Path]:
    """Remove the temp files that writers killed mid-write (SIGKILL, power loss) left in `folder`.

    A checkpoint's temp file is as large as the checkpoint and nothing else ever removes it.
    Only safe while holding the run directory's lock (`nmt.run.lock`): no other writer is busy.
    """
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        if _TEMP_NAME.match(path.name) and path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed


def check_file_target(path: Path, flag: str, default_name: str) -> None:
    """Refuse an output path that names a folder, before any work is done."""
    if path.is_dir():
        raise NmtError(f"{flag} {path} is a folder; give a file name, e.g. {path / default_name}")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        e.filename = str(path)  # not the random temp name
        raise
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except OSError as e:
        # A write into the temp file (a full disk) names no file, or the hidden temp name:
        # name the file the user asked for.
        if e.filename is None or e.filename == str(tmp_path):
            e.filename, e.filename2 = str(path), None
        raise
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
