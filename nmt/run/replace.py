"""Replacing an output deletes only what nmt wrote there: one rule for every command.

`nmt export -o DIR --force` once ran `shutil.rmtree(DIR)` on whatever DIR was: `-o RUN`
replaced a whole run directory, `-o RUN/checkpoints` deleted every checkpoint, `-o RUN/..`
began on the parent. So a command asks `check_replaceable` before it replaces an output
(`export --force`, `preprocess --force`, `average-checkpoints -o` over an existing file):

  * never a symbolic link, a run directory (it has config/, checkpoints/ or data/: see
    `nmt.run.directory`), a run's checkpoints/, or a folder holding a run directory;
  * otherwise only what that command writes, as the command's own test says: a folder with
    nmt_export.json and only the files an export writes, an earlier average, ...

A refusal is one line and deletes nothing; what is there stays for the user to judge.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from nmt.errors import NmtError

RUN_DIR_MARKERS = ("config", "checkpoints", "data")


def is_run_directory(path: Path) -> bool:
    """Whether `path` looks like a run directory: it holds one of config/, checkpoints/, data/."""
    return path.is_dir() and any((path / name).is_dir() for name in RUN_DIR_MARKERS)


def holds_only(folder: Path, allowed: Callable[[str], bool]) -> bool:
    """Whether `folder` holds nothing but plain files whose names `allowed` accepts (no subfolders,
    so a folder that passes cannot be the parent of anything)."""
    return all(entry.is_file() and not entry.is_symlink() and allowed(entry.name) for entry in folder.iterdir())


def _never_replaced(path: Path) -> Optional[str]:
    """Why `path` is never replaced by any command, or None."""
    if path.is_symlink():
        return "is a symbolic link"
    if not path.is_dir():
        return None
    real = path.resolve()  # `RUN/..` has the name "..": judge the folder it names
    if is_run_directory(real):
        return "is a run directory"
    if real.name == "checkpoints" and is_run_directory(real.parent):
        return f"is the checkpoints folder of run directory {real.parent}"
    for child in real.iterdir():
        if not child.is_symlink() and is_run_directory(child):
            return f"holds run directory {child}"
    return None


def check_replaceable(path: str | os.PathLike, flag: str, what: str, written_by_us: Callable[[Path], bool]) -> None:
    """Refuse, before anything is deleted, to replace `path` unless it is absent or what the
    command writes (`written_by_us`, described as `what`, e.g. "an earlier export").

    `flag` names the option that chose `path` (`-o`), for a message that says what to change.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return
    reason = _never_replaced(path)
    if reason is not None:
        why = f"it {reason}; nmt replaces only {what}"
    elif not written_by_us(path):
        why = f"it is not {what}"
    else:
        return
    raise NmtError(f"refusing to replace {path}: {why}, so nothing was deleted; remove it yourself or choose another {flag}")
