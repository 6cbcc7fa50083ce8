"""`nmt plot`: the learning curves of a run as a PNG."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nmt_cli.common import RunDirOption


def register(app: typer.Typer) -> None:
    @app.command("plot")
    def plot(
        run_dir: RunDirOption = None,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="PNG to write (default: RUN/learning_curves.png).", show_default=False)] = None,
    ) -> None:
        """Draw train/valid loss, learning rate and valid BLEU from RUN/logs/train.jsonl."""
        from nmt.train.plot import plot_learning_curves
        from nmt.run.directory import RunDir, resolve_run_dir

        rd = RunDir(resolve_run_dir(run_dir))
        png = plot_learning_curves(rd.log_dir / "train.jsonl", output or rd.root / "learning_curves.png")
        print(f"wrote {png}", file=sys.stderr)
