"""Scale-out on CPU: DDP over gloo equals one process with gradient accumulation; a dead worker
stops the job with its rank named, a user error in a worker is one line; fp16 loss scaling skips
overflows and stops on collapse."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from conftest import assert_one_line_error, finish, paused_in_time, run_nmt, start_nmt, start_script, wait_until
from nmt.train import distributed as dist_util
from nmt.run.checkpoint import load_checkpoint
from nmt.errors import NmtError
from test_train import TINY, fresh_copy  # noqa

DDP_ARGS = [*TINY[:-2], "--warmup", "4", "--dropout", "0", "--max-update", "4", "--seed", "5",
            "--log-interval", "1", "--no-epoch-checkpoints"]


def final_params(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints/checkpoint_last.pt")["model"]


def assert_same_params(a: dict, b: dict) -> None:
    for name, t in a.items():
        assert torch.allclose(t, b[name], rtol=1e-4, atol=1e-6), name


@pytest.fixture(scope="module")
def single_with_update_freq_2(prepared, tmp_path_factory) -> Path:  # noqa: F811
    run = fresh_copy(prepared, tmp_path_factory.mktemp("uf2") / "run")
    proc = run_nmt("train", "-r", run, *DDP_ARGS, "--update-freq", "2")
    assert proc.returncode == 0, proc.stderr
    return run


def test_two_gloo_processes_equal_one_process_with_update_freq_2(prepared, single_with_update_freq_2, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "ddp")
    proc = run_nmt("train", "-r", run, *DDP_ARGS, "--device", "cpu", "--distributed-world-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "2 process(es)" in proc.stderr
    assert_same_params(final_params(single_with_update_freq_2), final_params(run))
    ddp_log = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]
    one_log = [json.loads(l) for l in (single_with_update_freq_2 / "logs/train.jsonl").read_text().splitlines()]
    assert [r["wpb"] for r in ddp_log if r["kind"] == "train"] == [r["wpb"] for r in one_log if r["kind"] == "train"]


def test_torchrun_two_processes_give_the_same_result(prepared, single_with_update_freq_2, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "torchrun")
    torchrun = Path(sys.executable).with_name("torchrun")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = finish(start_script(torchrun, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
                               "-m", "nmt_cli", "train", "-r", run, *DDP_ARGS, "--device", "cpu",
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_params(final_params(single_with_update_freq_2), final_params(run))


def test_killed_worker_stops_the_job_naming_its_rank_and_rerun_resumes(prepared, tmp_path):  # noqa: F811
    args = [*TINY, "--max-update", "400", "--save-interval-updates", "5", "--device", "cpu", "--distributed-world-size", "2"]
    for attempt in range(3):  # rank 1 paused after a save, then killed: mid-run on any machine (see test_multinode)
        run = fresh_copy(prepared, tmp_path / f"run{attempt}")
        parent = start_nmt("train", "-r", run, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        workers: list[psutil.Process] = []

        def two_workers() -> bool:
            servers = [p for p in psutil.Process(parent.pid).children() if "forkserver" in " ".join(p.cmdline())]
            workers[:] = sorted((p for server in servers for p in server.children()), key=lambda p: (p.create_time(), p.pid))
            return len(workers) == 2

        wait_until(lambda: parent.poll() is not None or two_workers(), timeout=900)
        last = run / "checkpoints/checkpoint_last.pt"
        if paused_in_time(workers[1].pid, lambda: last.exists() or parent.poll() is not None,
                          lambda: parent.poll() is None and load_checkpoint(last)["train_state"]["update"] <= 390):
            break
        parent.communicate(timeout=900)
    else:
        pytest.fail("three runs got within 10 updates of their end before this test could pause them")
    workers[1].send_signal(signal.SIGKILL)
    _, stderr = parent.communicate(timeout=900)  # the others stopped: no hang
    assert parent.returncode != 0
    assert "rank 1" in stderr and "SIGKILL" in stderr and "Traceback" not in stderr
    assert "re-run the same command to resume from checkpoint_last.pt" in stderr  # it exists: true advice

    saved = load_checkpoint(run / "checkpoints/checkpoint_last.pt")["train_state"]["update"]
    again = run_nmt("train", "-r", run, *[a if a != "400" else str(saved + 5) for a in args])
    assert again.returncode == 0, again.stderr
    assert f"at update {saved}" in again.stderr
    assert load_checkpoint(run / "checkpoints/checkpoint_last.pt")["train_state"]["update"] == saved + 5


TWO_CPU_PROCESSES = SimpleNamespace(device="cpu", distributed_world_size=2, threads=1)


def _rank_1_stops_with_a_user_error(ctx, run_dir, cfg) -> None:
    if ctx.rank == 1:
        raise NmtError("out of memory on rank 1; lower --max-tokens")
    ctx.barrier()  # rank 0 waits for it in a collective, as in an update


def _rank_1_is_killed(ctx, run_dir, cfg) -> None:
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # until the launcher stops it


def test_a_user_error_in_the_workers_is_one_line_without_resume_advice(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    proc = run_nmt("train", "-r", run, *DDP_ARGS, "--device", "cpu", "--distributed-world-size", "2",
                   "--max-positions", "1")
    assert_one_line_error(proc, "nmt: error: no training pair fits the model's positions")
    assert "re-run" not in proc.stderr and "rank" not in proc.stderr


def test_a_user_error_in_one_worker_is_its_message_though_its_peer_fails_too(tmp_path):
    last = tmp_path / "checkpoint_last.pt"
    last.touch()
    with pytest.raises(NmtError) as raised:
        dist_util.launch(_rank_1_stops_with_a_user_error, tmp_path, TWO_CPU_PROCESSES, resume_from=last)
    assert str(raised.value) == "out of memory on rank 1; lower --max-tokens"


def test_a_worker_killed_before_any_checkpoint_gets_no_resume_advice(tmp_path):
    with pytest.raises(NmtError, match=r"^training process rank 1 died \(killed by SIGKILL\); the others were stopped$"):
        dist_util.launch(_rank_1_is_killed, tmp_path, TWO_CPU_PROCESSES, resume_from=tmp_path / "checkpoint_last.pt")


# -- fp16 dynamic loss scaling (on CPU) --------------------------------------------------------

def test_fp16_overflow_skips_the_update_and_halves_the_scale(prepared, tmp_path, monkeypatch):  # noqa: F811
    import nmt.train.loop as train_module
    from nmt.train.config import ModelSettings, TrainConfig

    import nmt.train.engine as engine_module
    real = engine_module.label_smoothed_nll_loss
    calls = {"n": 0}

    def huge_first(logits, target, eps):
        loss, nll = real(logits, target, eps)
        calls["n"] += 1
        return (loss * 1e30 if calls["n"] == 1 else loss), nll

    monkeypatch.setattr(engine_module, "label_smoothed_nll_loss", huge_first)
    run = fresh_copy(prepared, tmp_path / "run")
    cfg = TrainConfig(model=ModelSettings(arch="tiny"), max_tokens=256, threads=1, progress_bar=False, max_update=3, amp="fp16",
                      save_interval_minutes=0, log_interval=1, device="cpu")
    result = train_module.train(run, cfg)
    assert result.update == 3
    records = [json.loads(l) for l in (run / "logs/train.jsonl").read_text().splitlines()]
    skip = [r for r in records if r["kind"] == "skip"]
    assert len(skip) == 1 and skip[0]["loss_scale"] == 64.0  # 128 halved
    assert [r["update"] for r in records if r["kind"] == "train"] == [1, 2, 3]


def test_fp16_scale_collapse_stops_with_a_clear_message(prepared, tmp_path, monkeypatch):  # noqa: F811
    import nmt.train.loop as train_module
    from nmt.errors import NmtError
    from nmt.train.config import ModelSettings, TrainConfig

    import nmt.train.engine as engine_module
    real = engine_module.label_smoothed_nll_loss
    monkeypatch.setattr(engine_module, "label_smoothed_nll_loss",
                        lambda logits, target, eps: (real(logits, target, eps)[0] * float("inf"), real(logits, target, eps)[1]))
    run = fresh_copy(prepared, tmp_path / "run")
    cfg = TrainConfig(model=ModelSettings(arch="tiny"), max_tokens=256, threads=1, progress_bar=False, max_update=100, amp="fp16",
                      save_interval_minutes=0, device="cpu", max_skips=1000, min_loss_scale=1.0)
    with pytest.raises(NmtError, match="loss scale fell below"):
        train_module.train(run, cfg)


def test_out_of_memory_stops_the_job_with_advice_instead_of_hanging(prepared, tmp_path, monkeypatch):  # noqa: F811
    import nmt.train.loop as train_module
    from nmt.errors import NmtError
    from nmt.train.config import ModelSettings, TrainConfig

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    import nmt.train.engine as engine_module
    monkeypatch.setattr(engine_module, "forward_loss", oom)
    run = fresh_copy(prepared, tmp_path / "run")
    cfg = TrainConfig(model=ModelSettings(arch="tiny"), max_tokens=256, threads=1, progress_bar=False, max_update=3,
                      save_interval_minutes=0, device="cpu")
    with pytest.raises(NmtError, match="out of memory on rank 0.*lower --max-tokens"):
        train_module.train(run, cfg)
