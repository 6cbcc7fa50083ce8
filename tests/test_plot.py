"""`nmt plot`: a readable PNG of the learning curves, or a one-line reason why not."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.errors import NmtError
from nmt.train.plot import learning_curves_figure, plot_learning_curves, read_train_log


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def write_log(path: Path, with_bleu: bool = True, updates: int = 400) -> Path:
    """A train.jsonl shaped like training's: train records every 10 updates, valid every 100."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for u in range(10, updates + 1, 10):
        lr = 1e-3 * min(u / 100, math.sqrt(100 / u))
        loss = 9 * math.exp(-u / 150) + 3
        lines.append({"kind": "train", "epoch": 1 + u // 200, "update": u, "loss": loss, "nll_loss": loss - 0.5,
                      "ppl": 2 ** (loss - 0.5), "lr": lr, "wps": 5000.0, "gnorm": 1.2, "wall": u * 0.5})
        if u % 100 == 0:
            valid = {"kind": "valid", "epoch": 1 + u // 200, "update": u, "loss": loss + 0.3,
                     "nll_loss": loss - 0.2, "ppl": 2 ** (loss - 0.2), "wall": u * 0.5}
            if with_bleu:
                valid["bleu"] = 30 * (1 - math.exp(-u / 200))
            lines.append(valid)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return path


def test_learning_curves_png_with_bleu_panel(tmp_path: Path):
    log = write_log(tmp_path / "logs" / "train.jsonl")
    png = plot_learning_curves(log, tmp_path / "curves.png")
    assert png == tmp_path / "curves.png"
    width, height = png_size(png)
    assert (width, height) == (1920, 440)  # three panels of 640 x 440
    assert 20_000 < png.stat().st_size < 2_000_000
    assert not list(tmp_path.glob(".curves.png.*"))  # the atomic write left no temp file


def test_without_bleu_there_are_two_panels(tmp_path: Path):
    log = write_log(tmp_path / "train.jsonl", with_bleu=False)
    assert png_size(plot_learning_curves(log, tmp_path / "curves.png")) == (1280, 440)


def test_a_short_run_is_ticked_at_whole_updates(tmp_path: Path):
    log = write_log(tmp_path / "train.jsonl", updates=20)  # two train records, at updates 10 and 20
    fig = learning_curves_figure(read_train_log(log), log)
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_cli_writes_run_dir_learning_curves_png_by_default(tmp_path: Path):
    write_log(tmp_path / "logs" / "train.jsonl")
    proc = run_nmt("plot", "-r", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert png_size(tmp_path / "learning_curves.png")[0] > 0
    out = tmp_path / "other" / "lc.png"
    assert run_nmt("plot", "-r", tmp_path, "--output", out).returncode == 0
    assert png_size(out)[0] > 0


def test_missing_or_empty_log_is_one_line_error(tmp_path: Path):
    assert_one_line_error(run_nmt("plot", "-r", tmp_path), "train.jsonl", "nmt train")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.jsonl").write_text("", encoding="utf-8")
    assert_one_line_error(run_nmt("plot", "-r", tmp_path), "no train or valid loss records")
    assert not (tmp_path / "learning_curves.png").exists()


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path: Path):
    log = write_log(tmp_path / "train.jsonl", updates=30)
    with open(log, "a", encoding="utf-8") as f:
        f.write('{"kind": "train", "upda')
    assert [r["update"] for r in read_train_log(log)] == [10, 20, 30]
    assert png_size(plot_learning_curves(log, tmp_path / "c.png"))[0] > 0


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch):
    log = write_log(tmp_path / "train.jsonl", updates=30)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    with pytest.raises(NmtError, match=r"pip install 'nmt\[plot\]'"):
        plot_learning_curves(log, tmp_path / "c.png")
