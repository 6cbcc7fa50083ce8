"""Learning curves from `logs/train.jsonl` as one PNG: a picture says more than the log.

Panels, all against the update count: training and validation loss (label-smoothed, in
bits as logged), the learning rate (the warmup-then-inverse-square-root schedule of
Section 5.3 should be visible at a glance), and validation BLEU when training measured it.

matplotlib is an optional extra (`pip install 'nmt[plot]'`), imported only here, and only
its object-oriented Agg canvas is used: no pyplot, no global backend switch, no display.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nmt.run.atomic import atomic_path, check_file_target
from nmt.errors import NmtError


def read_train_log(jsonl_path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a train.jsonl; a line cut short by a crash mid-write is skipped."""
    path = Path(jsonl_path)
    if not path.is_file():
        raise NmtError(f"no training log {path}; train first with `nmt train`, or pass --run-dir")
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def _series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(updates, values) of `key` in the records of one kind, in log order."""
    xs, ys = [], []
    for r in records:
        if r.get("kind") == kind and isinstance(r.get("update"), (int, float)) and isinstance(r.get(key), (int, float)):
            xs.append(r["update"])
            ys.append(r[key])
    return xs, ys


def _import_matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise NmtError("plotting needs matplotlib, an optional extra: pip install 'nmt[plot]'") from None
    return Figure, FigureCanvasAgg


def plot_learning_curves(jsonl_path: str | os.PathLike, png_path: str | os.PathLike) -> Path:
    """Draw the learning curves of a train.jsonl into `png_path` (written atomically)."""
    check_file_target(Path(png_path), "-o", "learning_curves.png")
    fig = learning_curves_figure(read_train_log(jsonl_path), jsonl_path)
    png_path = Path(png_path)
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png")
    return png_path


def learning_curves_figure(records: list[dict[str, Any]], jsonl_path: str | os.PathLike) -> Any:
    """The panels as a matplotlib Figure (on an Agg canvas)."""
    train_loss = _series(records, "train", "loss")
    valid_loss = _series(records, "valid", "loss")
    if not train_loss[0] and not valid_loss[0]:
        raise NmtError(f"training log {jsonl_path} has no train or valid loss records yet; train longer, then plot")
    lr = _series(records, "train", "lr")
    bleu = _series(records, "valid", "bleu")

    Figure, FigureCanvasAgg = _import_matplotlib()
    n_panels = 3 if bleu[0] else 2
    fig = Figure(figsize=(6.4 * n_panels, 4.4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, n_panels)

    ax = axes[0]
    if train_loss[0]:
        ax.plot(*train_loss, label="train", color="tab:blue", linewidth=1.2)
    if valid_loss[0]:
        ax.plot(*valid_loss, label="valid", color="tab:orange", marker="o", markersize=3, linewidth=1.5)
    ax.set_title("loss")
    ax.set_xlabel("update")
    ax.set_ylabel("loss (label-smoothed, bits/token)")
    ax.legend()

    ax = axes[1]
    if lr[0]:
        ax.plot(*lr, color="tab:green", linewidth=1.2)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    else:
        ax.text(0.5, 0.5, "no learning rate logged", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("learning rate")
    ax.set_xlabel("update")

    if bleu[0]:
        ax = axes[2]
        ax.plot(*bleu, color="tab:red", marker="o", markersize=3, linewidth=1.5)
        best = max(range(len(bleu[1])), key=bleu[1].__getitem__)
        ax.plot([bleu[0][best]], [bleu[1][best]], marker="*", markersize=12, color="tab:red")
        ax.set_title(f"validation BLEU (best {bleu[1][best]:.2f} at update {bleu[0][best]})")
        ax.set_xlabel("update")
        ax.set_ylabel("BLEU")

    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # updates are whole: no tick at 16.25
    return fig
