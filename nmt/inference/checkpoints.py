"""The model a translation engine decodes with: a checkpoint's stock model given the device's ops.

Which checkpoint translates is `nmt.run.checkpoint_choice`'s rule, and the stock model a
checkpoint holds is built by `nmt.run.checkpoint.load_stock_model` (which `nmt export` uses
alone); what translation adds is the number type (--amp) and `nmt.ops.optimize_for`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

    from nmt.model.transformer import Transformer


def resolve_dtype(amp: str, device: torch.device) -> torch.dtype:
    import torch

    from nmt.device import resolve_amp

    return {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[resolve_amp(amp, device, "translate")]


def load_model(path: Path, device: torch.device, dtype: torch.dtype,
               expected: Optional[dict] = None, decoder: Optional[str] = "auto") -> Transformer:
    """A Transformer from a checkpoint's configuration and weights, ready for inference;
    with `expected` (a run's `nmt.run.identity`), refused when trained with another vocabulary.
    `decoder`: the decoding path to choose (`nmt.ops.optimize_for`, which may build the C++
    kernels); None: the stock model, as `nmt.run.checkpoint.load_stock_model` gives it."""
    from nmt.ops import optimize_for
    from nmt.run.checkpoint import load_stock_model

    model = load_stock_model(path, device, dtype, expected,
                             warn=lambda message: print(f"nmt translate: warning: {message}", file=sys.stderr))
    return (model if decoder is None else optimize_for(model, device, dtype, inference=True, decoder=decoder)).eval()
