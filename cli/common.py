"""Options shared by every subcommand."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

RunDirOption = Annotated[
    Optional[Path],
    typer.Option(
        "--run-dir",
        "-r",
        envvar="NMT_RUN_DIR",
        help="Run directory every step reads and writes (default: $NMT_RUN_DIR, else the current directory).",
        show_default=False,
    ),
]


def engine_search(settings: dict[str, Any], ctx: typer.Context) -> Optional[str]:
    """--engine ctranslate2 has one search, fairseq's rule with the |Y|^alpha penalty: where
    --beam-style and --lenpen-style were left at their defaults, `settings` takes those, and the
    note to say once is returned; a style typed on the command line that the engine lacks is
    still refused (nmt.inference.ctranslate2_engine)."""
    if settings.get("engine") != "ctranslate2":
        return None
    own = {"beam_style": "fairseq", "lenpen_style": "avg"}
    taken = [name for name, value in own.items()
             if settings[name] != value and getattr(ctx.get_parameter_source(name), "name", "DEFAULT") == "DEFAULT"]
    for name in taken:
        settings[name] = own[name]
    return "--engine ctranslate2 searches by its own rule: --beam-style fairseq --lenpen-style avg" if taken else None


CONTEXT = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
"""A command's own typer context (which flags were typed), for `with_parameters` signatures."""
