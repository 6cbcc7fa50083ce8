"""What `nmt train` shows while it trains and when it ends: the cadence of the log lines on slow
and fast machines, the CPU note, how the model is named, and an honest end under --max-time.

Time is a clock moved by hand (`FakeClock`), so each test holds on any machine and under load.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import run_nmt
from nmt.model.config import transformer_base, transformer_tiny
from nmt.train.log import TrainLogger
from test_train import TINY, fresh_copy  # noqa


class FakeClock:
    """time.monotonic for the test: it moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


UPDATE = {"loss_sum": 10.0, "nll_sum": 9.0, "ntokens": 5.0, "src_tokens": 5.0, "nsentences": 1.0, "gnorm": 1.0, "lr": 1e-3}


def train_lines(log_dir: Path) -> list[int]:
    return [r["update"] for r in map(json.loads, (log_dir / "train.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def run_updates(logger: TrainLogger, clock: FakeClock, n: int, seconds: float, first_seconds: float | None = None) -> None:
    """`n` updates of `seconds` each (the first of `first_seconds`), the last one ending training."""
    for update in range(1, n + 1):
        clock.now += first_seconds if update == 1 and first_seconds is not None else seconds
        logger.train_update(SimpleNamespace(epoch=1, update=update, train_time=0.0), UPDATE, last=update == n)


def quiet_logger(log_dir: Path, log_interval: int) -> TrainLogger:
    logger = TrainLogger(log_dir, log_interval=log_interval, progress_bar=False)
    logger.device = torch.device("cpu")
    return logger


# -- the cadence of the train lines -----------------------------------------------------

def test_slow_updates_show_the_first_update_at_once_then_a_line_a_minute(tmp_path, clock):
    """--log-interval 100 at 5 s an update would leave the screen blank for 8 minutes."""
    logger = quiet_logger(tmp_path, log_interval=100)
    run_updates(logger, clock, n=50, seconds=5.0)
    logger.close()
    assert train_lines(tmp_path) == [1, 13, 25, 37, 49, 50]  # 12 updates = 60 s; the last update ends training


def test_fast_updates_are_logged_at_multiples_of_the_interval_and_at_the_end(tmp_path, clock):
    logger = quiet_logger(tmp_path, log_interval=5)
    run_updates(logger, clock, n=23, seconds=0.01, first_seconds=2.0)  # even a slow first update: 4 x 2 s < 60 s
    logger.close()
    assert train_lines(tmp_path) == [5, 10, 15, 20, 23]


def test_validation_and_saving_do_not_count_towards_a_minute_of_training(tmp_path, clock):
    logger = quiet_logger(tmp_path, log_interval=100)
    for update in range(1, 5):
        clock.now += 0.01
        with logger.paused():
            clock.now += 100.0
        logger.train_update(SimpleNamespace(epoch=1, update=update, train_time=0.0), UPDATE)
    logger.close()
    assert not (tmp_path / "train.jsonl").read_text()


# -- the note for a paper-sized model on a CPU ---------------------------------------------

def cpu_trainer(mode: str, arch: str | None, typed_arch: str = "base", max_update: int = 50) -> SimpleNamespace:
    """What TrainLogger.start reads of a Trainer."""
    return SimpleNamespace(state=SimpleNamespace(update=0, train_time=0.0), device=torch.device("cpu"),
                           cfg=SimpleNamespace(model=SimpleNamespace(arch=typed_arch), max_update=max_update),
                           launch=SimpleNamespace(mode=mode), arch=arch)


def notes(capsys) -> list[str]:
    return [l for l in capsys.readouterr().err.splitlines() if l.startswith("note: ")]


def test_the_cpu_note_times_the_updates_after_the_first_and_advises_a_fresh_run(tmp_path, clock, capsys):
    """The first update pays for warm-up: 30 s here, then 4.5 s each. Extrapolating the first
    one said 25 min for 50 updates; the updates after it say 3m09s for the 42 left."""
    logger = quiet_logger(tmp_path, log_interval=100)
    logger.start(cpu_trainer("fresh", "base"), "model base")
    for update in range(1, 12):
        clock.now += 30.0 if update == 1 else 4.5
        if update == 4:  # a validation in between is not an update's time
            with logger.paused():
                clock.now += 120.0
        logger.train_update(SimpleNamespace(epoch=1, update=update, train_time=0.0), UPDATE)
    logger.close()
    (note,) = notes(capsys)
    assert note.startswith("note: one update of --arch base takes 4.5 s on this CPU (timed over 7 updates after the first)")
    assert "the 42 updates left to --max-update would take 3m09s" in note
    assert "For a first model on a CPU use --arch mini" in note


@pytest.mark.parametrize("mode", ["finetune", "resume"])
def test_a_fine_tune_or_a_resume_is_not_advised_another_arch(tmp_path, clock, capsys, mode):
    logger = quiet_logger(tmp_path, log_interval=100)
    logger.start(cpu_trainer(mode, "base"), "model base")
    run_updates(logger, clock, n=3, seconds=2.0)
    (note,) = notes(capsys)
    assert "one update of this base-sized model takes 2.0 s" in note and "--arch" not in note
    logger.close()

    other = quiet_logger(tmp_path / "small", log_interval=100)
    other.start(cpu_trainer(mode, arch=None), "model 2+2 layers, d_model 64, d_ff 256, 4 heads (from the checkpoint)")
    run_updates(other, clock, n=3, seconds=2.0)  # recorded as --arch base, but not base's size: no note
    other.close()
    assert notes(capsys) == []


# -- how the model is named -----------------------------------------------------------------

def test_a_model_is_named_by_the_architecture_of_its_size_else_by_its_size():
    from nmt.model.config import arch_of, model_size

    assert arch_of(transformer_base()) == "base" and arch_of(replace(transformer_base(), dropout=0.3)) == "base"
    imported = replace(transformer_tiny(), d_ff=256)
    assert arch_of(imported) is None
    assert model_size(imported) == "2+2 layers, d_model 64, d_ff 256, 4 heads"


def test_a_fine_tune_of_a_model_of_no_named_size_is_announced_by_its_size(prepared, tmp_path):  # noqa: F811
    first = fresh_copy(prepared, tmp_path / "first")
    proc = run_nmt("train", "-r", first, *TINY, "--d-ff", "256", "--max-update", "1", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "model 2+2 layers, d_model 64, d_ff 256, 4 heads, " in proc.stderr

    tune = fresh_copy(prepared, tmp_path / "tune")
    args = [a for a in TINY if a not in ("--arch", "tiny")]  # the checkpoint's own model, recorded as --arch base
    proc = run_nmt("train", "-r", tune, *args, "--finetune-from", first / "checkpoints/checkpoint_last.pt",
                   "--max-update", "2", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "model 2+2 layers, d_model 64, d_ff 256, 4 heads (from the checkpoint), " in proc.stderr
    assert "model base" not in proc.stderr and "note: " not in proc.stderr
    resumed = run_nmt("train", "-r", tune, "--max-update", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert "model 2+2 layers, d_model 64, d_ff 256, 4 heads, " in resumed.stderr and "model base" not in resumed.stderr


# -- in training: the end of a --max-time run, and logging that never changes the model ----------

def slow_training(monkeypatch, clock: FakeClock, update: float, validation: float, save: float) -> None:
    """Each update, validation and save of the real loop takes that long on the fake clock."""
    import nmt.train.loop as train_module
    from nmt.run.checkpoint_files import CheckpointManager

    def taking(method, seconds: float):
        def slow(*args, **kwargs):
            clock.now += seconds
            return method(*args, **kwargs)
        return slow

    monkeypatch.setattr(train_module.Trainer, "train_step", taking(train_module.Trainer.train_step, update))
    monkeypatch.setattr(train_module.Trainer, "validate", taking(train_module.Trainer.validate, validation))
    monkeypatch.setattr(CheckpointManager, "save", taking(CheckpointManager.save, save))


def tiny_config(**settings):
    from nmt.train.config import ModelSettings, TrainConfig

    return TrainConfig(model=ModelSettings(arch="tiny"), amp="none", max_tokens=256, threads=1, progress_bar=False,
                       save_interval_minutes=0, warmup=10, device="cpu", **settings)


def test_max_time_ends_with_one_line_that_says_what_the_final_validation_and_save_added(prepared, tmp_path,  # noqa: F811
                                                                                      monkeypatch, clock, capsys):
    """Training stops at the first update that reaches --max-time (update 3 at 60 s); the final
    validation (30 s) and save (15 s) run past it, and the last line says so instead of a
    total that looks like a budget overrun nobody explained."""
    from nmt.train.loop import train

    slow_training(monkeypatch, clock, update=20.0, validation=30.0, save=15.0)
    run = fresh_copy(prepared, tmp_path / "run")
    result = train(run, tiny_config(max_time=60.0))
    assert (result.stopped_by, result.update) == ("max_time", 3)
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == ("done: max_time reached at update 3, epoch 1; training stopped at 1m00s on the training clock, "
                    "the final validation and save took 45s (1m45s in all, 45s past --max-time 1m00s)")
    records = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]
    # update 1: 99 more updates at 20 s would keep the log silent for half an hour; update 3: training stops
    assert [(r["kind"], r["update"]) for r in records] == [("train", 1), ("train", 3), ("valid", 3), ("stop", 3)]


def test_how_often_training_logs_changes_no_parameter(prepared, tmp_path, monkeypatch, clock):  # noqa: F811
    """Logging is output only: a slow clock (a line at update 1 and every 60 s) and a still one
    (one line, at the end) train the same model, bit for bit."""
    from nmt.run.checkpoint import load_checkpoint
    from nmt.train.loop import train

    still = fresh_copy(prepared, tmp_path / "still")
    train(still, tiny_config(max_update=7))
    slow_training(monkeypatch, clock, update=20.0, validation=0.0, save=0.0)
    slow = fresh_copy(prepared, tmp_path / "slow")
    train(slow, tiny_config(max_update=7))
    assert train_lines(still / "logs") == [7] and train_lines(slow / "logs") == [1, 4, 7]
    a, b = (load_checkpoint(run / "checkpoints/checkpoint_last.pt")["model"] for run in (still, slow))
    assert all(torch.equal(a[k], b[k]) for k in a)
