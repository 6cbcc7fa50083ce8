"""The checkpoints/ folder: fairseq's file names, atomic writes, pruning.

One training state is serialised once per save; its other names (checkpoint_last.pt,
checkpoint_best.pt, ...) are hard links swapped in atomically, so a save costs one write
and no name ever points at a half-written file.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from nmt.checkpoint import save_checkpoint

INTERVAL_RE = re.compile(r"checkpoint_(\d+)_(\d+)\.pt$")
EPOCH_RE = re.compile(r"checkpoint(\d+)\.pt$")


def interval_checkpoints(folder: Path) -> list[Path]:
    """checkpoint_{epoch}_{update}.pt files, oldest update first."""
    found = [(int(m.group(2)), p) for p in folder.glob("checkpoint_*_*.pt") if (m := INTERVAL_RE.search(p.name))]
    return [p for _, p in sorted(found)]


def epoch_checkpoints(folder: Path) -> list[Path]:
    """checkpoint{epoch}.pt files, oldest epoch first."""
    found = [(int(m.group(1)), p) for p in folder.glob("checkpoint*.pt") if (m := EPOCH_RE.search(p.name))]
    return [p for _, p in sorted(found)]


class CheckpointManager:
    def __init__(self, folder: Path, keep_last: int = -1, keep_last_epochs: int = -1, enabled: bool = True):
        self.folder, self.keep_last, self.keep_last_epochs, self.enabled = folder, keep_last, keep_last_epochs, enabled

    def save(self, checkpoint: dict[str, Any], names: list[str]) -> None:
        """Write `checkpoint` under every name in `names` (first written, the rest linked)."""
        if not self.enabled or not names:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        # checkpoint_last.pt first: it is what a resume after a crash mid-save needs
        names = sorted(names, key=lambda n: n != "checkpoint_last.pt")
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
        self.prune()

    def prune(self) -> None:
        if self.keep_last >= 0:
            for p in interval_checkpoints(self.folder)[: -self.keep_last or None]:
                p.unlink(missing_ok=True)
        if self.keep_last_epochs >= 0:
            for p in epoch_checkpoints(self.folder)[: -self.keep_last_epochs or None]:
                p.unlink(missing_ok=True)

    def newest_interval_or_epoch(self) -> Optional[Path]:
        """The most recent numbered checkpoint, to suggest when checkpoint_last.pt is damaged."""
        candidates = interval_checkpoints(self.folder) + epoch_checkpoints(self.folder)
        return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None
