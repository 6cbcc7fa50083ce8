"""Checkpoints: plain dicts of tensors and plain data, written atomically, loaded safely.

Layout (fairseq's file names, nanoGPT's self-describing dict):
    {"model": state_dict, "config": {TransformerConfig fields}, "train_state": {...},
     "optimizer": optimizer state_dict, "version": 1}
Only `model` and `config` are needed to translate; they load with `weights_only=True`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from nmt.atomic import atomic_path
from nmt.errors import NmtError

CHECKPOINT_VERSION = 1


def save_checkpoint(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """Write `checkpoint` to `path` atomically: a crash never leaves a damaged file there."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        try:
            torch.save(checkpoint, f)
        except RuntimeError as e:
            # Through a Python file, a full disk is an OSError (ENOSPC) that torch's zip writer
            # then buries under "unexpected pos"; the OSError is what the user can act on.
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None
            raise


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True`; a missing or damaged file is a user error.
    With `mmap`, tensors stay on disk until read (to look at a checkpoint without loading it)."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # torch raises many types for truncated/corrupt zip files
        reason = str(e).splitlines()[0].split(". ")[0] if str(e) else type(e).__name__
        raise NmtError(f"checkpoint {path} is damaged or not an nmt checkpoint ({reason})") from None
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "config" not in checkpoint:
        raise NmtError(f"checkpoint {path} is not an nmt checkpoint (no 'model'/'config' entries)")
    return checkpoint
