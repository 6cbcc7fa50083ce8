"""Checkpoints keep their own schedule whatever the epoch length, and `--max-time` is a budget."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import run_nmt
from nmt.run.checkpoint import load_checkpoint
from nmt.run.checkpoint_files import epoch_checkpoints, interval_checkpoints
from test_train import TINY, fresh_copy  # noqa

# TINY without its "--save-interval-minutes 0"
BASE = [a for i, a in enumerate(TINY) if a != "--save-interval-minutes" and TINY[i - 1] != "--save-interval-minutes"]


def records(run: Path) -> list[dict]:
    return [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]


def stored(path: Path) -> dict:
    return load_checkpoint(path)["train_state"]


def epoch_length(run: Path) -> int:
    """Updates per epoch, read from the log of a run that crossed an epoch boundary."""
    train = [r for r in records(run) if r["kind"] == "train"]
    return max(r["update"] for r in train if r["epoch"] == 1)


@pytest.mark.parametrize("max_tokens, interval, max_update", [("256", 40, 120), ("64", 5, 60)],
                         ids=["epochs-shorter", "epochs-longer"])
def test_update_interval_checkpoints_fall_on_multiples_whatever_the_epoch_length(prepared, tmp_path, max_tokens, interval, max_update):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    args = [*BASE, "--max-tokens", max_tokens, "--save-interval-minutes", "0", "--save-interval-updates", str(interval),
            "--max-update", str(max_update), "--keep-last", "-1", "--log-interval", "1"]
    proc = run_nmt("train", "-r", run, *args)
    assert proc.returncode == 0, proc.stderr
    per_epoch = epoch_length(run)
    assert per_epoch < interval if max_tokens == "256" else per_epoch > 2 * interval
    saved = [stored(p)["update"] for p in interval_checkpoints(run / "checkpoints")]
    assert saved == list(range(interval, max_update + 1, interval))
    # epoch checkpoints hold the model only; interval ones can be resumed from exactly
    for p in epoch_checkpoints(run / "checkpoints"):
        if not any(p.samefile(q) for q in interval_checkpoints(run / "checkpoints")):
            assert "optimizer" not in load_checkpoint(p)
    assert all("optimizer" in load_checkpoint(p) for p in interval_checkpoints(run / "checkpoints"))


@pytest.mark.parametrize("max_tokens, minutes", [("256", "0.03"), ("48", "0.01")], ids=["epochs-shorter", "epochs-longer"])
def test_minute_interval_checkpoints_follow_the_training_clock_not_the_epochs(prepared, tmp_path, max_tokens, minutes):  # noqa: F811
    """Epoch-end saves used to restart the interval timer, so with epochs shorter than the
    interval no interval checkpoint was ever written. Now each one marks a new multiple of the
    interval on the training clock."""
    run = fresh_copy(prepared, tmp_path / "run")
    period = float(minutes) * 60  # --max-time 5.4s is a multiple of both: the final save is its interval's save
    proc = run_nmt("train", "-r", run, *BASE, "--max-tokens", max_tokens, "--save-interval-minutes", minutes,
                   "--max-time", "5.4s", "--keep-last", "-1", "--log-interval", "1")
    assert proc.returncode == 0, proc.stderr
    times = [stored(p)["train_time"] for p in interval_checkpoints(run / "checkpoints")]
    final = stored(run / "checkpoints/checkpoint_last.pt")["train_time"]
    slots = [math.floor(t / period) for t in times]
    assert slots == sorted(set(slots)), "two interval checkpoints in one interval"
    assert len(times) >= 0.5 * final / period, (len(times), final, period)
    valid_epochs = {r["epoch"] for r in records(run) if r["kind"] == "valid"}
    if max_tokens == "256":
        assert len(valid_epochs) > len(times) / 2  # many epochs ended, and the cadence went on regardless


def test_max_time_is_a_budget_that_counts_validation(prepared, tmp_path):  # noqa: F811
    """`--max-time` ends the run within the budget plus one update and one validation."""
    run = fresh_copy(prepared, tmp_path / "run")
    budget = 5.0
    proc = run_nmt("train", "-r", run, *BASE, "--save-interval-minutes", "0", "--max-time", f"{budget:g}s",
                   "--validate-interval-updates", "5", "--log-interval", "1")
    assert proc.returncode == 0, proc.stderr
    recs = records(run)
    final = stored(run / "checkpoints/checkpoint_last.pt")["train_time"]
    # the longest step of the training clock: an update (train record to train record) or a validation
    walls = [r["wall"] for r in recs if r["kind"] in ("train", "valid")]
    longest = max(b - a for a, b in zip(walls, walls[1:]))
    assert budget <= final <= budget + 2 * longest + 1.0, (final, longest)
    valid_updates = [r["update"] for r in recs if r["kind"] == "valid"]
    assert len(valid_updates) == len(set(valid_updates)), "validated twice at one update"
    saved_updates = [stored(p)["update"] for p in interval_checkpoints(run / "checkpoints")]
    assert len(saved_updates) == len(set(saved_updates))
    assert "max_time reached" in proc.stderr


def test_no_state_is_written_twice_when_an_epoch_ends_on_an_interval_save(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    probe = fresh_copy(prepared, tmp_path / "probe")
    assert run_nmt("train", "-r", probe, *BASE, "--save-interval-minutes", "0", "--max-epoch", "1", "--log-interval", "1").returncode == 0
    per_epoch = epoch_length(probe)
    proc = run_nmt("train", "-r", run, *BASE, "--save-interval-minutes", "0", "--save-interval-updates", str(per_epoch),
                   "--max-epoch", "2", "--keep-last", "-1")
    assert proc.returncode == 0, proc.stderr
    ck = run / "checkpoints"
    assert (ck / "checkpoint1.pt").samefile(ck / f"checkpoint_1_{per_epoch}.pt")
    assert (ck / "checkpoint2.pt").samefile(ck / f"checkpoint_2_{2 * per_epoch}.pt")
    assert (ck / "checkpoint_last.pt").samefile(ck / f"checkpoint_2_{2 * per_epoch}.pt")


def test_keep_last_bounds_the_interval_checkpoints_by_default(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *BASE, "--save-interval-minutes", "0", "--save-interval-updates", "2",
                   "--max-update", "20")
    assert proc.returncode == 0, proc.stderr
    kept = [stored(p)["update"] for p in interval_checkpoints(run / "checkpoints")]
    assert kept == [12, 14, 16, 18, 20]  # --keep-last 5
