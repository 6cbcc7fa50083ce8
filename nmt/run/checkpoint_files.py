"""The checkpoints/ folder: fairseq's file names, atomic writes, pruning.

One training state is serialised once per save; its other names (checkpoint_last.pt,
checkpoint_best.pt, ...) are hard links swapped in atomically, so a save costs one write
and no name ever points at a half-written file; the folder is synced after the swaps, so
that a power loss cannot undo them.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional, Sequence

from nmt.run.atomic import fsync_directory
from nmt.run.checkpoint import save_checkpoint

# fairseq's names: checkpoint{epoch}.pt at epoch ends, checkpoint_{epoch}_{update}.pt at
# update or time intervals (the paper's 10-minute checkpoints). Training writes them
# (`nmt.train.policy.checkpoint_names`); pruning, recovery and averaging read them by these.
INTERVAL_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")
EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")


def interval_checkpoints(folder: Path) -> list[Path]:
    """checkpoint_{epoch}_{update}.pt files, oldest update first."""
    found = [(int(m.group(2)), p) for p in folder.glob("checkpoint_*_*.pt") if (m := INTERVAL_RE.search(p.name))]
    return [p for _, p in sorted(found)]


def epoch_checkpoints(folder: Path) -> list[Path]:
    """checkpoint{epoch}.pt files, oldest epoch first."""
    found = [(int(m.group(1)), p) for p in folder.glob("checkpoint*.pt") if (m := EPOCH_RE.search(p.name))]
    return [p for _, p in sorted(found)]


def newest_intact_checkpoint(folder: Path, exclude: Optional[Path] = None) -> Optional[Path]:
    """The most recent numbered checkpoint that loads, to name in a recovery hint.

    checkpoint_last.pt and the newest numbered checkpoint can be hard links to one file, so a
    damaged last one may share its data with them: candidates are checked by loading, and a
    link to `exclude` (the same inode) is skipped without trying.
    """
    from nmt.run.checkpoint import load_checkpoint
    from nmt.errors import NmtError

    excluded = None
    if exclude is not None and exclude.exists():
        st = exclude.stat()
        excluded = (st.st_dev, st.st_ino)
    candidates = interval_checkpoints(folder) + epoch_checkpoints(folder)
    for path in sorted(candidates, key=_stored_update_or_mtime, reverse=True):
        st = path.stat()
        if excluded == (st.st_dev, st.st_ino):
            continue
        try:
            load_checkpoint(path)
        except NmtError:
            continue
        return path
    return None


def _stored_update_or_mtime(path: Path) -> tuple[float, float]:
    m = INTERVAL_RE.search(path.name)
    return (float(m.group(2)) if m else -1.0, path.stat().st_mtime)


class CheckpointManager:
    def __init__(self, folder: Path, keep_last: int = -1, keep_last_epochs: int = -1, enabled: bool = True):
        self.folder, self.keep_last, self.keep_last_epochs, self.enabled = folder, keep_last, keep_last_epochs, enabled

    def save(self, full_state: dict[str, Any], full_names: list[str],
             model_state: Optional[dict[str, Any]] = None, model_only_names: Sequence[str] = ()) -> None:
        """Write `full_state` once under `full_names` (the first written, the rest hard links), and
        `model_state` once under `model_only_names`. checkpoint_last.pt goes first: it is what a
        resume after a crash mid-save needs."""
        if not self.enabled:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        full_names = sorted(full_names, key=lambda n: n != "checkpoint_last.pt")
        if full_names:
            self._write_linked(full_state, full_names)
        if model_only_names:
            self._write_linked(model_state if model_state is not None else full_state, list(model_only_names))
        self.prune()

    def _write_linked(self, checkpoint: dict[str, Any], names: list[str]) -> None:
        first = self.folder / names[0]
        save_checkpoint(first, checkpoint)
        for name in names[1:]:
            target = self.folder / name
            tmp = self.folder / f".{name}.link.tmp"
            if tmp.exists():
                tmp.unlink()
            try:
                os.link(first, tmp)
            except OSError:  # filesystems without hard links
                shutil.copyfile(first, tmp)
            os.replace(tmp, target)
        if len(names) > 1:
            fsync_directory(self.folder)  # the links' renames; save_checkpoint synced the first name's

    def prune(self) -> None:
        if self.keep_last >= 0:
            for p in interval_checkpoints(self.folder)[: -self.keep_last or None]:
                p.unlink(missing_ok=True)
        if self.keep_last_epochs >= 0:
            for p in epoch_checkpoints(self.folder)[: -self.keep_last_epochs or None]:
                p.unlink(missing_ok=True)
