"""Atomic file writes: a temp file in the same folder, fsync, rename, then fsync the folder.

A crash mid-write must never leave a half-written record or checkpoint where a later step
would read it; `os.replace` is atomic on POSIX within one filesystem. The rename itself is
durable only once its folder is synced (`fsync_directory`).
"""

from __future__ import annotations

import errno
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


def fsync_directory(path: str | os.PathLike) -> None:
    """Flush the folder `path`'s entries to disk, after a rename that publishes a file in it.

    fsync of a file does not persist its name: until the folder is synced, a power loss can
    undo a rename, losing a just-written checkpoint_last.pt or record (the old one or none comes
    back). A filesystem that cannot sync a folder (EINVAL) is left to its own ordering.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask, which files nmt publishes follow as `open` would (0644 under 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o22)  # where /proc has no Umask line: read it by setting it (not thread-safe, rare)
    os.umask(mask)
    return mask


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
        os.chmod(tmp_path, 0o666 & ~current_umask())  # mkstemp's 0600 would hide it from the user's team
        os.replace(tmp_path, path)
        fsync_directory(path.parent)
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
