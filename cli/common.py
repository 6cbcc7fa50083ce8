"""Options shared by every subcommand."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

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
