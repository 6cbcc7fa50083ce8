"""`nmt train`: the recipe runs, logs what the paper's formulas say, resumes exactly, fails clearly."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, paused_in_time, run_nmt, start_nmt
from nmt.run.checkpoint import load_checkpoint
from nmt.train.schedule import paper_lr

WORDS = "a house dog cat runs sees the big small red blue green man woman child plays eats walks".split()


def write_corpus(folder: Path, n_train: int = 400, n_valid: int = 40, seed: int = 0) -> None:
    """A synthetic task: the target is the source reversed, in upper case."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(n)]
        (folder / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / f"{split}.de").write_text("\n".join(" ".join(s.split()[::-1]).upper() for s in src) + "\n", encoding="utf-8")


def fresh_copy(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


# fp32 (`--amp none`): `auto` would mean bf16 on CPUs with bf16 units, slower for a tiny model and
# machine-dependent; bf16 has its own tests.
TINY = ["--arch", "tiny", "--amp", "none", "--max-tokens", "256", "--threads", "1", "--no-progress-bar",
        "--save-interval-minutes", "0", "--warmup", "10"]


def test_log_records_lr_of_the_papers_formula_every_update(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "12", "--log-interval", "1")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["update"] for r in train] == list(range(1, 13))
    for r in train:
        assert r["lr"] == pytest.approx(paper_lr(r["update"], 64, 10), rel=1e-9)
        for key in ("epoch", "loss", "nll_loss", "ppl", "wps", "gnorm", "wall"):
            assert key in r
        assert r["ppl"] == pytest.approx(2 ** r["nll_loss"], rel=1e-2)
    assert any(r["kind"] == "valid" for r in records)
    ckpt = load_checkpoint(run / "checkpoints/checkpoint_last.pt")
    assert ckpt["train_state"]["update"] == 12 and ckpt["config"]["d_model"] == 64


def test_resume_after_sigkill_ends_with_identical_parameters(prepared, tmp_path):
    args = [*TINY, "--max-update", "40", "--save-interval-updates", "20", "--seed", "3", "--log-interval", "5"]
    once = fresh_copy(prepared, tmp_path / "once")
    assert run_nmt("train", "-r", once, *args).returncode == 0

    for attempt in range(5):  # paused after its first save, killed only while its last is still to come
        killed = fresh_copy(prepared, tmp_path / f"killed{attempt}")
        proc = start_nmt("train", "-r", killed, *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        last = killed / "checkpoints/checkpoint_last.pt"
        if paused_in_time(proc.pid, lambda: last.exists() or proc.poll() is not None,
                          lambda: proc.poll() is None and load_checkpoint(last)["train_state"]["update"] < 40):
            break
        proc.wait()
    else:
        pytest.fail("five runs saved their last checkpoint before this test could pause them")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert load_checkpoint(killed / "checkpoints/checkpoint_last.pt")["train_state"]["update"] < 40
    resumed = run_nmt("train", "-r", killed, *args)
    assert resumed.returncode == 0, resumed.stderr

    a = load_checkpoint(once / "checkpoints/checkpoint_last.pt")
    b = load_checkpoint(killed / "checkpoints/checkpoint_last.pt")
    assert a["train_state"]["update"] == b["train_state"]["update"] == 40
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_finished_run_reinvoked_does_nothing(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    args = [*TINY, "--max-update", "5", "--save-interval-updates", "5"]
    assert run_nmt("train", "-r", run, *args).returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
    again = run_nmt("train", "-r", run, *args)
    assert again.returncode == 0 and "nothing to do" in again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()} == before


def test_damaged_last_checkpoint_is_named_and_kept(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    assert run_nmt("train", "-r", run, *TINY, "--max-update", "6", "--save-interval-updates", "3").returncode == 0
    last = run / "checkpoints/checkpoint_last.pt"
    last.unlink()
    last.write_bytes(b"not a checkpoint")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "9")
    assert_one_line_error(proc, "checkpoint_last.pt", "--restore-file", "checkpoint_1_6.pt")
    assert last.read_bytes() == b"not a checkpoint"


def test_training_without_preprocessed_data_says_to_preprocess(tmp_path):
    assert_one_line_error(run_nmt("train", "-r", tmp_path, "--arch", "tiny"), "nmt preprocess")


def test_unknown_arch_is_refused_before_any_work(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    assert_one_line_error(run_nmt("train", "-r", run, "--arch", "huge"), "tiny, mini, small, base, big")
    assert not (run / "checkpoints").exists()


def test_shared_embeddings_with_separate_vocabularies_are_refused(tmp_path):
    write_corpus(tmp_path / "text")
    run = tmp_path / "run"
    proc = run_nmt("preprocess", "-r", run, "-s", "en", "-t", "de", "--trainpref", tmp_path / "text/train",
                   "--vocab-size", "60", "--no-joined", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert_one_line_error(run_nmt("train", "-r", run, *TINY, "--max-update", "2", "--share-all-embeddings"),
                          "--share-all-embeddings")
    ok = run_nmt("train", "-r", run, *TINY, "--max-update", "2")  # default: separate embeddings
    assert ok.returncode == 0, ok.stderr


def test_bf16_autocast_trains_on_cpu(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "4", "--amp", "bf16", "--log-interval", "1")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records if r["kind"] == "train")
    assert json.loads((run / "config/train.json").read_text())["precision"] == "bf16"


def test_non_finite_losses_skip_updates_then_stop_clearly(prepared, tmp_path, monkeypatch):
    import nmt.train.loop as train_module
    from nmt.errors import NmtError
    from nmt.train.config import ModelSettings, TrainConfig

    import nmt.train.engine as engine_module
    real = engine_module.label_smoothed_nll_loss

    def poisoned(logits, target, eps):
        loss, nll = real(logits, target, eps)
        return loss * float("nan"), nll

    monkeypatch.setattr(engine_module, "label_smoothed_nll_loss", poisoned)
    run = fresh_copy(prepared, tmp_path / "run")
    cfg = TrainConfig(model=ModelSettings(arch="tiny"), max_tokens=256, threads=1, progress_bar=False, max_update=50, max_skips=3,
                      save_interval_minutes=0)
    with pytest.raises(NmtError, match="3 updates in a row"):
        train_module.train(run, cfg)
    skips = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in skips] == ["skip"] * 2  # the third raises before logging


def test_pairs_longer_than_the_positions_are_skipped_and_counted(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "2", "--max-positions", "8")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((run / "config/train.json").read_text())
    assert record["skipped_long_pairs"] > 0
    assert f"{record['skipped_long_pairs']} skipped as longer than 7 tokens" in proc.stderr


def test_eval_bleu_logs_valid_bleu_and_picks_the_best_checkpoint_by_it(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *TINY, "--max-update", "3", "--eval-bleu")
    assert proc.returncode == 0, proc.stderr
    valid = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines() if '"valid"' in l]
    assert valid and 0.0 <= valid[-1]["bleu"] <= 100.0
    assert load_checkpoint(run / "checkpoints/checkpoint_best.pt")["train_state"]["best_bleu"] == valid[0]["bleu"]


def test_raising_the_update_limit_continues_a_finished_run(prepared, tmp_path):
    run = fresh_copy(prepared, tmp_path / "run")
    assert run_nmt("train", "-r", run, *TINY, "--max-update", "3").returncode == 0
    more = run_nmt("train", "-r", run, *TINY, "--max-update", "5")
    assert more.returncode == 0, more.stderr
    assert "resuming from" in more.stderr
    assert load_checkpoint(run / "checkpoints/checkpoint_last.pt")["train_state"]["update"] == 5


def test_interval_throughput_leaves_out_validation_and_saving(prepared, tmp_path, monkeypatch):
    """wps, src_wps and ups measure training: the validations and saves inside a log interval
    are left out of its time, while the training clock (wall) keeps them. Each takes 1000 s
    here, on a clock moved by hand, so the test holds on any machine."""
    import time

    import nmt.train.loop as train_module
    from nmt.run.checkpoint_files import CheckpointManager
    from nmt.train.config import ModelSettings, TrainConfig

    real_monotonic, slept = time.monotonic, [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + slept[0])

    def taking_1000_s(method):
        def slow(*args, **kwargs):
            slept[0] += 1000.0
            return method(*args, **kwargs)
        return slow

    monkeypatch.setattr(train_module.Trainer, "validate", taking_1000_s(train_module.Trainer.validate))
    monkeypatch.setattr(CheckpointManager, "save", taking_1000_s(CheckpointManager.save))
    run = fresh_copy(prepared, tmp_path / "run")
    cfg = TrainConfig(model=ModelSettings(arch="tiny"), amp="none", max_tokens=256, threads=1, progress_bar=False,
                      max_update=6, log_interval=3, validate_interval_updates=2, save_interval_updates=2,
                      save_interval_minutes=0)
    train_module.train(run, cfg)
    records = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["update"] for r in train] == [3, 6]
    assert train[-1]["wall"] >= 4000  # two validations and two saves before update 6, on the training clock
    for r in train:
        assert 3 * r["wpb"] / r["wps"] < 1000, r  # the interval's seconds as its wps counts them: training only
