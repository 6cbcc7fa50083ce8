"""Training you can watch: one progress display for the whole run, logs that do not depend on
the terminal, TensorBoard on request, early stopping, and advice for paper-sized models on a CPU."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import termios
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_nmt, start_nmt
from nmt.train.progress import Limits, format_duration, time_to_end
from nmt.train.policy import patience_count
from test_train import fresh_copy  # noqa

TINY = ["--arch", "tiny", "--amp", "none", "--max-tokens", "256", "--threads", "1", "--save-interval-minutes", "0", "--warmup", "10"]


def run_on_terminal(*args: str) -> tuple[int, str]:
    """`nmt ARGS` with stdin, stdout and stderr on a pseudo-terminal of 200 columns, as a user sees it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    proc = start_nmt(*args, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=600), b"".join(chunks).decode("utf-8", errors="replace")


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "logs/train.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


# -- the estimate ----------------------------------------------------------------------

def test_estimate_goes_to_whichever_limit_ends_first():
    limits = Limits(max_update=1000, max_time=600.0)
    # 2 updates/s: 900 updates left take 450 s, before the 500 s left on the clock.
    est = time_to_end(limits, 100, 100.0, 2.0)
    assert (est.limit, est.seconds) == ("max_update", pytest.approx(450.0))
    est = time_to_end(limits, 100, 300.0, 2.0)
    assert (est.limit, est.seconds) == ("max_time", pytest.approx(300.0))
    est = time_to_end(Limits(max_epoch=3), 10, 5.0, 2.0, updates_left_in_epochs=40)
    assert (est.limit, est.seconds) == ("max_epoch", pytest.approx(20.0))
    assert time_to_end(Limits(), 10, 5.0, 2.0) is None
    assert format_duration(3725) == "1h02m" and format_duration(250) == "4m10s" and format_duration(37) == "37s"


# -- the progress display ----------------------------------------------------------------

@pytest.mark.parametrize("limit,args", [("max_update", ["--max-update", "40"]),
                                        ("max_time", ["--max-time", "3s", "--max-update", "100000"])])
def test_terminal_shows_one_bar_with_the_estimate_to_the_end_of_the_run(prepared, tmp_path, limit, args):
    run = fresh_copy(prepared, tmp_path / "run")
    code, screen = run_on_terminal("train", "-r", run, *TINY, *args, "--log-interval", "10")
    assert code == 0, screen
    shown = re.findall(r"train +\d+%\|[^|]*\| (upd [^\r\n]*)", screen)
    assert shown, screen
    assert all("ETA " in s and f" to {limit}" in s for s in shown), shown
    assert any("/40 " in s for s in shown) if limit == "max_update" else any("/3s " in s for s in shown)
    for key in ("loss ", "lr ", "tok/s", "mem "):
        assert key in shown[-1], shown[-1]
    assert "epoch 001" not in screen  # no bar per epoch any more
    # Log lines stay on the screen: each train record is a line of its own.
    kept = re.findall(r"\repoch \d+ \| update (\d+) \| loss [^\r\n]*\r\n", screen)
    assert [int(u) for u in kept] == [r["update"] for r in records(run, "train")]
    # train.log gets the train records with a terminal too.
    assert len([l for l in (run / "logs/train.log").read_text().splitlines() if "| update " in l and "valid" not in l]) \
        == len(records(run, "train"))


def test_without_a_terminal_train_log_and_jsonl_hold_the_same_train_records(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "30", "--log-interval", "5")
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    train = records(run, "train")
    assert [r["update"] for r in train] == [5, 10, 15, 20, 25, 30]
    log_lines = [l for l in (run / "logs/train.log").read_text().splitlines() if " | update " in l and "valid |" not in l]
    assert len(log_lines) == len(train)
    for rec, line in zip(train, log_lines):
        for key, value in rec.items():
            if key == "lr":  # the line rounds it to 4 significant digits; the record keeps the float
                assert f"lr {value:.4g} |" in line, (value, line)
            elif key != "kind":
                assert f"{key} {value}" in line, (key, value, line)
    stop = records(run, "stop")
    assert stop and stop[-1]["reason"] == "max_update" and stop[-1]["update"] == 30


# -- TensorBoard --------------------------------------------------------------------------

def test_tensorboard_writes_the_expected_scalars_only_when_asked(prepared, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "20", "--log-interval", "5")
    assert proc.returncode == 0, proc.stderr
    assert not (run / "tensorboard").exists() and not (run / "logs/tensorboard").exists()

    logdir = tmp_path / "tb"
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "40", "--log-interval", "5", "--tensorboard-logdir", logdir)
    assert proc.returncode == 0, proc.stderr
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {f"train/{k}" for k in ("loss", "nll_loss", "ppl", "lr", "gnorm", "wps")} | \
               {f"valid/{k}" for k in ("loss", "nll_loss", "ppl")}
    assert expected <= tags, tags
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert steps == [25, 30, 35, 40]  # the resumed launch logs from where it continued
    assert [e.value for e in acc.Scalars("train/loss")][-1] == pytest.approx(records(run, "train")[-1]["loss"], rel=1e-6)


# -- early stopping -------------------------------------------------------------------------

def test_patience_counts_only_strict_improvements():
    assert patience_count(5.0, None, 0, higher_is_better=False) == (5.0, 0)
    assert patience_count(5.0, 5.0, 0, higher_is_better=False) == (5.0, 1)
    assert patience_count(4.9, 5.0, 1, higher_is_better=False) == (4.9, 0)
    assert patience_count(30.0, 31.0, 1, higher_is_better=True) == (31.0, 2)


def test_patience_stops_a_run_whose_validation_cannot_improve(prepared, tmp_path):
    """With a peak learning rate of 1e-38, every Adam step (at most ~lr in size) is below half a
    unit in the last place of any weight it is added to, and parameters that start at 0 only
    reach ~1e-38, which vanishes when added to any activation: the model cannot change, so
    the validation loss cannot improve. The test checks that it indeed stays the same."""
    run = fresh_copy(prepared, tmp_path / "run")
    args = [*TINY, "--lr", "1e-38", "--max-update", "1000", "--validate-interval-updates", "4", "--patience", "2"]
    proc = run_nmt("train", "-r", run, *args)
    assert proc.returncode == 0, proc.stderr
    valid = records(run, "valid")
    assert [r["update"] for r in valid] == [4, 8, 12]
    assert len({r["loss"] for r in valid}) == 1
    stop = records(run, "stop")[-1]
    assert stop["reason"] == "patience" and stop["update"] == 12 and stop["stale_validations"] == 2
    assert stop["metric"] == "loss" and stop["best"] == valid[0]["loss"]
    last = proc.stderr.strip().splitlines()[-1]
    assert "stopped early" in last and "--patience 2" in last and "update 12" in last
    # The count is in the checkpoint: re-running does not start over.
    again = run_nmt("train", "-r", run, *args)
    assert again.returncode == 0 and "already finished" in again.stderr, again.stderr


def test_bleu_as_best_metric_needs_eval_bleu(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "4", "--best-checkpoint-metric", "bleu", "--patience", "3")
    assert_one_line_error(proc, "--best-checkpoint-metric bleu needs --eval-bleu")
    assert not (run / "checkpoints").exists()


# -- a paper-sized model on a CPU ----------------------------------------------------------

def test_base_on_a_cpu_says_how_long_an_update_takes_and_where_the_cpu_settings_are(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    # base's width with one layer a side, so that the test stays fast: still --arch base.
    proc = run_nmt("train", "-r", run, "--arch", "base", "--encoder-layers", "1", "--decoder-layers", "1", "--d-ff", "512",
                   "--max-tokens", "128", "--threads", "1", "--max-update", "2", "--no-epoch-checkpoints",
                   "--save-interval-minutes", "0", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    hint = [l for l in proc.stderr.splitlines() if "one update of --arch base takes" in l]
    assert len(hint) == 1 and "--arch mini" in hint[0] and "README" in hint[0], proc.stderr
    assert re.search(r"takes \d+\.\d s on this CPU", hint[0])
    tiny = run_nmt("train", "-r", fresh_copy(prepared, tmp_path / "tiny"), *TINY, "--max-update", "2")
    assert tiny.returncode == 0 and "one update of" not in tiny.stderr
