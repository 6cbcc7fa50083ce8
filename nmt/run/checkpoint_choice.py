"""Which checkpoint of a run translates: one rule for every engine and for export.

`nmt translate`, `nmt serve`, `nmt.load`, the CTranslate2 engine and `nmt export` all pick a
run's checkpoint here (checkpoint_avg.pt, else checkpoint_best.pt, else checkpoint_last.pt, or
the one given), so the rule cannot drift apart between them. It is a matter of file names only:
nothing here imports torch, so the CTranslate2 engine picks its checkpoint without it
(`nmt.run.checkpoint.load_stock_model` then builds the model the file holds).
"""

from __future__ import annotations

from pathlib import Path

from nmt.errors import NmtError
from nmt.run.directory import RunDir

DEFAULT_CHECKPOINTS = ("checkpoint_avg.pt", "checkpoint_best.pt", "checkpoint_last.pt")


def default_checkpoint(run: RunDir) -> Path:
    """The averaged checkpoint if there is one, else the best, else the last."""
    for name in DEFAULT_CHECKPOINTS:
        path = run.checkpoint_dir / name
        if path.is_file():
            return path
    raise NmtError(
        f"no checkpoint to translate with in {run.checkpoint_dir} (looked for {', '.join(DEFAULT_CHECKPOINTS)}); "
        f"run `nmt train` first or pass --checkpoint"
    )


def resolve_checkpoint(run: RunDir, given: str | Path) -> Path:
    """A --checkpoint as given, else relative to the run's checkpoints/ folder."""
    path = Path(given)
    if path.is_file():
        return path
    inside = run.checkpoint_dir / path
    if not path.is_absolute() and inside.is_file():
        return inside
    raise NmtError(f"checkpoint not found: {given} (also looked in {run.checkpoint_dir})")
