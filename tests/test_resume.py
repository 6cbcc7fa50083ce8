"""One resume rule: a run directory remembers its settings, survives SIGKILL and Ctrl-C at any
moment (also mid fine-tune and after a --reset-lr-scheduler launch), and never overwrites history."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, paused_in_time, run_nmt, start_nmt, wait_until
from nmt.run.checkpoint import load_checkpoint
from nmt.train.schedule import paper_lr, peak_lr
from test_train import TINY, fresh_copy  # noqa


def train_records(run: Path) -> list[dict]:
    lines = (run / "logs/train.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines]


def logged(run: Path) -> list[tuple]:
    """What a run's log says happened: (kind, update, loss) of every record, in order."""
    return [(r["kind"], r["update"], r.get("loss"), r.get("lr")) for r in train_records(run) if r["kind"] != "skip"]


def last_params(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints/checkpoint_last.pt")["model"]


def assert_bit_identical(a: Path, b: Path) -> None:
    pa, pb = last_params(a), last_params(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name


def train_killing_at_random_moments(prepared: Path, run: Path, args: list[str], rng: random.Random, kills: int) -> int:
    """Train a fresh copy of `prepared` in `run` with `args`, SIGKILL it at random moments while it
    trains (or saves), re-run the same command each time, and let the last run finish. Returns
    the kills made. Each kill pauses the run first (SIGSTOP) and kills it only if it has not
    exited: a run that finished before this process was scheduled is started again on a fresh
    copy, so that a loaded machine changes the moments, never the number of kills."""
    for _ in range(5):
        shutil.rmtree(run, ignore_errors=True)
        fresh_copy(prepared, run)
        made = 0
        for _ in range(kills + 20):
            proc = start_nmt("train", "-r", run, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if made < kills:
                log = run / "logs/train.jsonl"
                start_size = log.stat().st_size if log.is_file() else 0
                target_growth = rng.randint(1, 6) * 60  # roughly that many records more (each ~60-200 bytes)
                wait_until(lambda: proc.poll() is not None or (log.is_file() and log.stat().st_size >= start_size + target_growth),
                           timeout=900, poll=0.005)
                time.sleep(rng.uniform(0.0, 0.08))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGSTOP)
                if proc.poll() is None:  # paused, not exited: the kill lands mid-run
                    proc.kill()
                    made += 1
            _, err = proc.communicate(timeout=900)
            if proc.returncode == 0:
                break
            assert proc.returncode == -signal.SIGKILL, err.decode()
        else:
            raise AssertionError("training never finished")
        if made == kills:
            return made
    raise AssertionError(f"five runs finished before this test could kill them {kills} time(s)")


def test_sigkill_at_random_moments_in_training_fine_tuning_and_after_a_reset_launch(prepared, tmp_path):  # noqa: F811
    rng = random.Random(11)
    common = [*TINY, "--seed", "3", "--log-interval", "1", "--save-interval-updates", "4", "--keep-last", "-1"]

    # 1. plain training
    plain = [*common, "--max-update", "30"]
    once, killed = fresh_copy(prepared, tmp_path / "once"), tmp_path / "killed"
    assert run_nmt("train", "-r", once, *plain).returncode == 0
    assert train_killing_at_random_moments(prepared, killed, plain, rng, kills=1) == 1  # once proves the resume
    assert_bit_identical(once, killed)
    assert logged(once) == logged(killed)
    updates = [u for kind, u, _, _ in logged(killed) if kind == "train"]
    assert updates == list(range(1, 31))  # each update logged once

    # 2. fine-tuning from the first run's model
    tune = [*common, "--max-update", "24", "--finetune-from", str(once / "checkpoints/checkpoint_last.pt"), "--lr", "1e-3"]
    tune_once, tune_killed = fresh_copy(prepared, tmp_path / "tune_once"), tmp_path / "tune_killed"
    assert run_nmt("train", "-r", tune_once, *tune).returncode == 0
    assert train_killing_at_random_moments(prepared, tune_killed, tune, rng, kills=1) == 1
    assert_bit_identical(tune_once, tune_killed)
    assert logged(tune_once) == logged(tune_killed)

    # 3. a --reset-lr-scheduler launch from the first run's checkpoint, killed right after it starts
    reset = [*common, "--max-update", "42", "--restore-file", str(once / "checkpoints/checkpoint_last.pt"),
             "--reset-lr-scheduler", "--warmup", "4"]
    reset_once, reset_killed = fresh_copy(prepared, tmp_path / "reset_once"), tmp_path / "reset_killed"
    assert run_nmt("train", "-r", reset_once, *reset).returncode == 0
    assert train_killing_at_random_moments(prepared, reset_killed, reset, rng, kills=1) == 1
    assert_bit_identical(reset_once, reset_killed)
    assert logged(reset_once) == logged(reset_killed)
    first = next(r for r in train_records(reset_killed) if r["kind"] == "train")
    assert first["update"] == 31 and first["lr"] == pytest.approx(paper_lr(1, 64, 4), rel=1e-9)  # the schedule restarted
    assert load_checkpoint(reset_killed / "checkpoints/checkpoint_last.pt")["train_state"]["lr_offset"] == 30


def test_train_with_no_flags_continues_a_run_with_its_recorded_settings(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    first = run_nmt("train", "-r", run, "--arch", "tiny", "--max-tokens", "192", "--lr", "2e-3", "--warmup", "7",
                    "--threads", "1", "--no-progress-bar", "--max-update", "6", "--log-interval", "1",
                    "--save-interval-minutes", "0", "--dropout", "0.2")
    assert first.returncode == 0, first.stderr
    recorded = json.loads((run / "config/train.json").read_text())["train_config"]

    more = run_nmt("train", "-r", run, "--max-update", "9")
    assert more.returncode == 0, more.stderr
    changes = [l for l in more.stderr.splitlines() if l.startswith("changed ")]
    assert changes == ["changed --max-update: 6 -> 9 (was recorded in this run)"]
    lrs = {r["update"]: r["lr"] for r in train_records(run) if r["kind"] == "train"}
    assert sorted(lrs) == list(range(1, 10))
    for update, lr in lrs.items():
        assert lr == pytest.approx(peak_lr(update, 2e-3, 7), rel=1e-9)
    record = json.loads((run / "config/train.json").read_text())
    assert {k: v for k, v in record["train_config"].items() if k != "max_update"} == \
           {k: v for k, v in recorded.items() if k != "max_update"}
    assert record["train_config"]["max_update"] == 9
    assert [l["changes"] for l in record["launches"]][-1] == {"max_update": [6, 9]}

    again = run_nmt("train", "-r", run)
    assert again.returncode == 0 and "nothing to do" in again.stderr

    other = run_nmt("train", "-r", run, "--arch", "base")
    assert_one_line_error(other, "--arch tiny", "--arch base")


def test_word_dropout_is_recorded_and_a_changed_value_applies_on_resume(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    first = run_nmt("train", "-r", run, *TINY, "--max-update", "4", "--dropout-src", "0.1", "--dropout-trg", "0.2")
    assert first.returncode == 0, first.stderr
    model = load_checkpoint(run / "checkpoints/checkpoint_last.pt")["config"]
    assert (model["dropout_src"], model["dropout_trg"]) == (0.1, 0.2)
    more = run_nmt("train", "-r", run, "--max-update", "6", "--dropout-src", "0.3")
    assert more.returncode == 0, more.stderr
    assert "changed --dropout-src: 0.1 -> 0.3 (was recorded in this run)" in more.stderr.splitlines()
    model = load_checkpoint(run / "checkpoints/checkpoint_last.pt")["config"]
    assert (model["dropout_src"], model["dropout_trg"]) == (0.3, 0.2)
    assert_one_line_error(run_nmt("train", "-r", run, "--max-update", "8", "--dropout-trg", "1"), "--dropout-trg")


def test_a_missing_checkpoint_last_never_lets_training_overwrite_the_others(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    args = [*TINY, "--max-update", "6", "--save-interval-updates", "3"]
    assert run_nmt("train", "-r", run, *args).returncode == 0
    (run / "checkpoints/checkpoint_last.pt").unlink()
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    proc = run_nmt("train", "-r", run, *args, "--max-update", "9")
    assert_one_line_error(proc, "no checkpoint_last.pt", "--restore-file", "checkpoint_1_6.pt")
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before


def test_the_hint_for_a_damaged_last_checkpoint_names_one_that_loads(prepared, tmp_path):  # noqa: F811
    """checkpoint_last.pt and the newest numbered checkpoint are one file (hard links): damage
    to one is damage to both, so the hint must skip it and name an older one that loads."""
    run = fresh_copy(prepared, tmp_path / "run")
    assert run_nmt("train", "-r", run, *TINY, "--max-update", "6", "--save-interval-updates", "3").returncode == 0
    last = run / "checkpoints/checkpoint_last.pt"
    assert last.samefile(run / "checkpoints/checkpoint_1_6.pt")
    with open(last, "r+b") as f:  # damage the shared data in place
        f.truncate(100)
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "9")
    assert_one_line_error(proc, "checkpoint_last.pt", "--restore-file", "checkpoint_1_3.pt")
    resumed = run_nmt("train", "-r", run, *TINY, "--max-update", "9", "--restore-file", str(run / "checkpoints/checkpoint_1_3.pt"))
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(last)["train_state"]["update"] == 9


@pytest.mark.parametrize("schedule", [[], ["--lr-cooldown", "0.5"]], ids=["inverse-sqrt", "cooldown"])
def test_ctrl_c_saves_the_update_reached_and_a_rerun_continues_exactly(prepared, tmp_path, schedule):  # noqa: F811
    args = [*TINY, "--max-update", "40", "--seed", "4", "--log-interval", "1", "--save-interval-updates", "25", *schedule]
    once = fresh_copy(prepared, tmp_path / "once")
    assert run_nmt("train", "-r", once, *args).returncode == 0

    for attempt in range(5):  # Ctrl-C lands mid-run: the run is paused to check, then interrupted
        run = fresh_copy(prepared, tmp_path / f"run{attempt}")
        proc = start_nmt("train", "-r", run, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log = run / "logs/train.jsonl"
        logged_updates = lambda: log.read_text().count('"train"') if log.is_file() else 0  # noqa: E731
        if paused_in_time(proc.pid, lambda: logged_updates() >= 8 or proc.poll() is not None,
                          lambda: proc.poll() is None and logged_updates() <= 40 - 3):  # the update in flight, and one more
            break
        proc.communicate(timeout=900)
    else:
        pytest.fail("five runs got within 3 updates of their end before this test could pause them")
    proc.send_signal(signal.SIGINT)
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=900)
    lines = [l for l in err.decode().splitlines() if l.startswith("nmt:")]
    assert proc.returncode == 130
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err.decode()
    reached = max(r["update"] for r in train_records(run) if r["kind"] == "train")
    assert 8 <= reached < 40
    assert load_checkpoint(run / "checkpoints/checkpoint_last.pt")["train_state"]["update"] == reached
    assert f"update {reached}" in lines[0]

    assert run_nmt("train", "-r", run, *args).returncode == 0
    assert_bit_identical(once, run)
    assert [u for kind, u, _, _ in logged(run) if kind == "train"] == list(range(1, 41))


@pytest.mark.parametrize("flag, value", [("--warmup", "-10"), ("--dropout", "1.5"), ("--adam-beta2", "1.5"), ("--lr-cooldown", "1.5"),
                                         ("--d-model", "0"), ("--label-smoothing", "1.5"), ("--max-tokens", "0")])
def test_numeric_flags_outside_their_meaning_are_one_line(prepared, tmp_path, flag, value):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    assert_one_line_error(run_nmt("train", "-r", run, *TINY, "--max-update", "2", flag, value), flag)
    assert not (run / "checkpoints").exists()


def test_warmup_zero_means_no_warmup(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY[:-2], "--warmup", "0", "--lr", "1e-3", "--max-update", "3", "--log-interval", "1")
    assert proc.returncode == 0, proc.stderr
    lrs = [r["lr"] for r in train_records(run) if r["kind"] == "train"]
    assert lrs == pytest.approx([1e-3, 1e-3 / 2**0.5, 1e-3 / 3**0.5])


def test_lr_cooldown_decays_the_rate_linearly_to_zero_over_the_last_fraction_of_the_run(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY[:-2], "--warmup", "4", "--lr", "1e-3", "--max-update", "10",
                   "--lr-cooldown", "0.5", "--log-interval", "1")
    assert proc.returncode == 0, proc.stderr
    lrs = {r["update"]: r["lr"] for r in train_records(run) if r["kind"] == "train"}
    # Update u runs at how far the run was before it, (u - 1) / 10: the schedule's own rate up
    # to half way, then 0.8, 0.6, 0.4, 0.2 of it.
    assert [lrs[u] / peak_lr(u, 1e-3, 4) for u in range(1, 11)] == pytest.approx([1] * 6 + [0.8, 0.6, 0.4, 0.2])


def test_lr_cooldown_under_max_time_follows_the_training_clock(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY[:-2], "--warmup", "0", "--lr", "1e-3", "--max-time", "4s",
                   "--lr-cooldown", "1", "--log-interval", "1")
    assert proc.returncode == 0, proc.stderr
    records = [r for r in train_records(run) if r["kind"] == "train"]
    assert len(records) >= 3
    # Without warmup the schedule's rate is 1e-3 / sqrt(u); the factor left is 1 - clock / 4 s.
    factors = [r["lr"] / (1e-3 * r["update"] ** -0.5) for r in records]
    assert all(0.0 <= f <= 1.0 for f in factors) and factors == sorted(factors, reverse=True)
    assert factors[-1] < factors[0]


def test_lr_cooldown_needs_a_run_length(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    assert_one_line_error(run_nmt("train", "-r", run, *TINY, "--lr-cooldown", "0.2"), "--max-update or --max-time")
    assert not (run / "checkpoints").exists()


def test_fine_tuning_from_another_model_is_one_line(prepared, tmp_path):  # noqa: F811
    other = fresh_copy(prepared, tmp_path / "other")
    assert run_nmt("train", "-r", other, *TINY, "--max-update", "2", "--d-model", "32", "--n-heads", "2").returncode == 0
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "2", "--finetune-from", str(other / "checkpoints/checkpoint_last.pt"))
    assert_one_line_error(proc, "do not fit")
    restore = run_nmt("train", "-r", run, *TINY, "--max-update", "2", "--restore-file", str(other / "checkpoints/checkpoint_last.pt"))
    assert_one_line_error(restore, "different model")


def test_changed_batching_restarts_the_epoch_with_a_warning(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    assert run_nmt("train", "-r", run, *TINY, "--max-update", "5", "--log-interval", "1").returncode == 0
    more = run_nmt("train", "-r", run, "--max-update", "8", "--max-tokens", "128")
    assert more.returncode == 0, more.stderr
    assert "changed --max-tokens: 256 -> 128" in more.stderr
    assert "epoch 1 restarts from its beginning" in more.stderr
    state = load_checkpoint(run / "checkpoints/checkpoint_last.pt")["train_state"]
    assert state["update"] == 8 and state["updates_in_epoch"] == 3 and state["batching"]["max_tokens"] == 128


def test_a_resume_whose_precision_differs_from_the_records_says_so(prepared, tmp_path):  # noqa: F811
    """`--amp auto` resolves per machine (bf16 only with bf16 matrix units): a run moved to
    another machine, or recorded by an older nmt, is told when its precision changes."""
    run = fresh_copy(prepared, tmp_path / "run")
    assert run_nmt("train", "-r", run, *TINY, "--max-update", "3").returncode == 0
    record = json.loads((run / "config/train.json").read_text(encoding="utf-8"))
    now = record["precision"]
    record["precision"] = "fp16"  # as if recorded where auto meant something else
    (run / "config/train.json").write_text(json.dumps(record), encoding="utf-8")
    more = run_nmt("train", "-r", run, "--max-update", "5")
    assert more.returncode == 0, more.stderr
    said = " ".join(more.stderr.split())
    assert f"warning: precision fp16 -> {now} from this launch on (--amp none); pass --amp fp16 to keep fp16" in said
    assert "precision fp16 ->" in (run / "logs/train.log").read_text(encoding="utf-8")
    # an ordinary resume says nothing about precision
    again = run_nmt("train", "-r", run, "--max-update", "6")
    assert again.returncode == 0 and "warning: precision" not in again.stderr


def files_of(run: Path) -> dict[str, bytes]:
    """Every byte of a run's checkpoints/ and logs/, by relative path."""
    return {str(p.relative_to(run)): p.read_bytes() for folder in ("checkpoints", "logs")
            for p in sorted((run / folder).rglob("*")) if p.is_file()}


def numbered(run: Path, update: int) -> Path:
    """checkpoint_{epoch}_{update}.pt, whatever epoch the update fell in."""
    (path,) = (run / "checkpoints").glob(f"checkpoint_*_{update}.pt")
    return path


def test_a_fine_tuned_run_without_checkpoint_last_is_refused_and_left_byte_identical(prepared, tmp_path):  # noqa: F811
    """Re-running the first launch's command (or plain `nmt train`) must not fine-tune again at
    update 0, truncate the logs or overwrite the numbered checkpoints; the hinted --restore-file
    continues the run (it is not refused for the recorded --finetune-from)."""
    a = fresh_copy(prepared, tmp_path / "a")
    assert run_nmt("train", "-r", a, *TINY, "--max-update", "6").returncode == 0
    b = fresh_copy(prepared, tmp_path / "b")
    tune = [*TINY, "--finetune-from", str(a / "checkpoints/checkpoint_last.pt"), "--save-interval-updates", "5",
            "--max-update", "20", "--log-interval", "1"]
    assert run_nmt("train", "-r", b, *tune).returncode == 0
    (b / "checkpoints/checkpoint_last.pt").unlink()
    before = files_of(b)
    newest = numbered(b, 20)
    for command in (tune, []):
        assert_one_line_error(run_nmt("train", "-r", b, *command), "no checkpoint_last.pt", f"--restore-file {newest}")
        assert files_of(b) == before
    more = run_nmt("train", "-r", b, "--restore-file", str(newest), "--max-update", "22")
    assert more.returncode == 0, more.stderr
    updates = [u for kind, u, _, _ in logged(b) if kind == "train"]
    assert updates == list(range(1, 23))  # one log, continued: nothing started over


def test_a_damaged_last_in_a_reset_run_is_continued_with_its_adam_state_and_schedule(prepared, tmp_path):  # noqa: F811
    """A run started with --restore-file A --reset-optimizer --reset-lr-scheduler whose
    checkpoint_last.pt is damaged: the same command is refused (no roll-back to A), and the
    hinted --restore-file continues exactly as an unbroken run, without resetting again."""
    a = fresh_copy(prepared, tmp_path / "a")
    assert run_nmt("train", "-r", a, *TINY, "--max-update", "8", "--seed", "5").returncode == 0
    start = [*TINY, "--restore-file", str(a / "checkpoints/checkpoint_last.pt"), "--reset-optimizer",
             "--reset-lr-scheduler", "--save-interval-updates", "4", "--log-interval", "1", "--keep-last", "-1"]
    unbroken, broken = fresh_copy(prepared, tmp_path / "unbroken"), fresh_copy(prepared, tmp_path / "broken")
    assert run_nmt("train", "-r", unbroken, *start, "--max-update", "24").returncode == 0
    assert run_nmt("train", "-r", broken, *start, "--max-update", "16").returncode == 0
    last = broken / "checkpoints/checkpoint_last.pt"
    last.write_bytes(b"")  # zero bytes; checkpoint_*_16.pt is the same file
    before = files_of(broken)
    intact = numbered(broken, 12)
    same = run_nmt("train", "-r", broken, *start, "--max-update", "24")
    assert_one_line_error(same, "checkpoint_last.pt", "not one of this run's checkpoints", f"--restore-file {intact}")
    assert files_of(broken) == before
    resumed = run_nmt("train", "-r", broken, "--restore-file", str(intact), "--max-update", "24")
    assert resumed.returncode == 0, resumed.stderr
    lrs = {u: lr for kind, u, _, lr in logged(unbroken) if kind == "train"}
    assert {u: lr for kind, u, _, lr in logged(broken) if kind == "train"} == lrs  # update 13's lr included
    assert_bit_identical(unbroken, broken)  # Adam's moments continued, not reset
