"""Which checkpoint translates, and the model it holds: one module for every engine and for export.

`nmt translate`, `nmt serve`, `nmt.load`, the CTranslate2 engine and `nmt export` all pick a
run's checkpoint (checkpoint_avg.pt, else checkpoint_best.pt, else checkpoint_last.pt, or the
one given) and build its model here, so the rule and the vocabulary check cannot drift apart.
Which checkpoint is a matter of file names: torch is imported only to build a model, so the
CTranslate2 engine picks its checkpoint without it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from nmt.errors import NmtError
from nmt.run.directory import RunDir

if TYPE_CHECKING:
    import torch

    from nmt.model.transformer import Transformer

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


def resolve_dtype(amp: str, device: torch.device) -> torch.dtype:
    import torch

    from nmt.device import resolve_amp

    return {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[resolve_amp(amp, device, "translate")]


def load_model(path: Path, device: torch.device, dtype: torch.dtype,
               expected: Optional[dict] = None, decoding: bool = True) -> Transformer:
    """A Transformer from a checkpoint's configuration and weights, ready for inference;
    with `expected` (a run's `nmt.run.identity`), refused when trained with another vocabulary.
    `decoding`: with the device's decoding ops (`nmt.ops.optimize_for`, which may build the C++
    kernels); without, the stock model, for a command that only reads its weights (export)."""
    from nmt.model.config import TransformerConfig
    from nmt.model.transformer import Transformer
    from nmt.ops import optimize_for
    from nmt.run.checkpoint import load_checkpoint
    from nmt.run.identity import check_identity, checkpoint_identity

    checkpoint = load_checkpoint(path)
    if expected is not None:
        check_identity(checkpoint_identity(checkpoint), expected, f"checkpoint {path}",
                       warn=lambda message: print(f"nmt translate: warning: {message}", file=sys.stderr))
    try:
        model = Transformer(TransformerConfig.from_dict(checkpoint["config"]))
        model.load_state_dict(checkpoint["model"])
    except (RuntimeError, TypeError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise NmtError(f"checkpoint {path} does not match its own model configuration ({reason}); it is damaged") from None
    model = model.to(device=device, dtype=dtype)
    return (optimize_for(model, device, dtype, inference=True) if decoding else model).eval()
