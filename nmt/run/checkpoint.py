"""Checkpoints: plain dicts of tensors and plain data, written atomically, loaded safely.

Layout (fairseq's file names, nanoGPT's self-describing dict):
    {"model": state_dict, "config": {TransformerConfig fields}, "train_state": {...},
     "optimizer": optimizer state_dict, "version": 1}
Only `model` and `config` are needed to translate; they load with `weights_only=True`, and
`load_checkpoint` checks this layout (`structure_problem`), so a crafted or foreign file is one
line naming it. `load_stock_model` builds the model a checkpoint holds, for every engine and export.
"""

from __future__ import annotations

import os
import reprlib
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from nmt.run.atomic import atomic_path
from nmt.errors import NmtError
from nmt.run.identity import IDENTITY_KEY, check_identity, checkpoint_identity
from nmt.run.state import TrainState
from nmt.model.config import TransformerConfig
from nmt.model.transformer import Transformer
from nmt.settings import check_ranges

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
    problem = structure_problem(checkpoint)
    if problem is not None:
        raise NmtError(f"checkpoint {path} is not an nmt checkpoint ({problem})")
    return checkpoint


def load_stock_model(path: Path, device: torch.device, dtype: torch.dtype, expected: Optional[dict[str, Any]] = None, *,
                     warn: Callable[[str], None]) -> Transformer:
    """The model a checkpoint holds, built from its own configuration with stock torch ops only
    (`nmt.model.transformer`), on `device` in `dtype`, in eval mode: what export reads, and what
    translation gives the device's ops (`nmt.inference.checkpoints.load_model`). With `expected`
    (a run's `nmt.run.identity`), refused when trained with another vocabulary; `warn` says
    what could not be checked."""
    checkpoint = load_checkpoint(path)
    if expected is not None:
        check_identity(checkpoint_identity(checkpoint), expected, f"checkpoint {path}", warn)
    try:
        model = Transformer(TransformerConfig.from_dict(checkpoint["config"]))
        model.load_state_dict(checkpoint["model"])
    except (RuntimeError, TypeError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise NmtError(f"checkpoint {path} does not match its own model configuration ({reason}); it is damaged") from None
    return model.to(device=device, dtype=dtype).eval()


OPTIONAL_DICTS = ("train_state", "train_config", "optimizer", IDENTITY_KEY, "rng")
"""Entries that training, averaging and the identity check read as dicts when they are there."""


def structure_problem(checkpoint: Any) -> str | None:
    """What is wrong with the layout above, or None: `weights_only=True` guarantees plain data,
    not the layout every reader indexes into, so a crafted or foreign file is refused here in
    one line rather than with a KeyError or TypeError deep in training or translation."""
    if not isinstance(checkpoint, dict):
        return f"a {type(checkpoint).__name__}, not a dict"
    for key in ("model", "config"):
        if key not in checkpoint:
            return f"no {key!r} entry"
    model = checkpoint["model"]
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
        return "'model' is not a dict of named tensors"
    config = checkpoint["config"]
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        return "'config' is not a dict of model settings"
    try:  # the settings it holds; older checkpoints lack some, which take their defaults
        check_ranges(TransformerConfig.from_dict(config), {k: r for k, r in TransformerConfig.RANGES.items() if k in config})
    except NmtError as e:
        return f"its 'config' says {e}"
    for key in OPTIONAL_DICTS:
        if checkpoint.get(key) is not None and not isinstance(checkpoint[key], dict):
            return f"{key!r} is a {type(checkpoint[key]).__name__}, not a dict"
    return _train_state_problem(checkpoint.get("train_state") or {})


def _train_state_problem(state: dict[str, Any]) -> str | None:
    """A field of 'train_state' whose value is not of TrainState's type for it, or None."""
    hints = typing.get_type_hints(TrainState)
    for name, value in state.items():
        if name in hints and not _fits(value, hints[name]):
            hint = hints[name]
            expected = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
            return f"train_state {name!r} is {reprlib.repr(value)}, not {expected}"
    return None


def _fits(value: Any, hint: Any) -> bool:
    """`value` is plain data of the type `hint` (int, float, Optional[...], dict[str, int]);
    bool is not a number here, an int is a float."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        return any(_fits(value, a) for a in args)
    if typing.get_origin(hint) is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    if hint in (int, float):
        return not isinstance(value, bool) and isinstance(value, int if hint is int else (int, float))
    return isinstance(value, hint)
