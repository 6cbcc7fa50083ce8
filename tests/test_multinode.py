"""Many nodes, proven on one host: two torchrun agents (one process each, gloo on CPU) meet at a
c10d rendezvous as two nodes would and train as one job, equal to one process with
--update-freq 2. Killing one node's worker stops both agents; re-running them, or torchrun's
own --max-restarts, continues from checkpoint_last.pt to the same weights, bit for bit."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import ForkedNmt, paused_in_time, run_nmt, start_script, wait_until
from nmt.run.checkpoint import load_checkpoint
from test_distributed import assert_same_params, final_params
from test_runlock import hold_lock
from test_train import TINY, fresh_copy  # noqa

MAX_UPDATE, SAVE_EVERY = 40, 4
ARGS = [*TINY[:-2], "--warmup", "4", "--dropout", "0", "--seed", "5", "--no-epoch-checkpoints",
        "--max-update", str(MAX_UPDATE), "--save-interval-updates", str(SAVE_EVERY), "--log-interval", "10"]


def start_two_nodes(run: Path, *torchrun_args: str) -> list[subprocess.Popen | ForkedNmt]:
    """Two torchrun agents, started as on two machines; their output goes to RUN.node0/1.log."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    command = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", *torchrun_args,
               "-m", "nmt_cli", "train", "-r", str(run), *ARGS, "--device", "cpu"]
    agents = []
    for i in range(2):
        with open(f"{run}.node{i}.log", "a") as log:
            agents.append(start_script(torchrun, *command, stdout=log, stderr=subprocess.STDOUT))
    return agents


def wait_for(agents: list[subprocess.Popen | ForkedNmt], timeout: float = 900) -> list[int]:
    """Both agents' exit statuses; an agent still running after `timeout` seconds fails the test."""
    deadline = time.monotonic() + timeout
    try:
        return [agent.wait(timeout=max(0.0, deadline - time.monotonic())) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                for p in [*psutil.Process(agent.pid).children(recursive=True), psutil.Process(agent.pid)]:
                    p.kill()
                agent.wait()


def workers_of(agents: list[subprocess.Popen | ForkedNmt]) -> list[psutil.Process]:
    return [w for agent in agents for w in psutil.Process(agent.pid).children()]


def worker_of_rank(agents: list[subprocess.Popen | ForkedNmt], rank: int) -> psutil.Process:
    return next(w for w in workers_of(agents) if w.environ().get("RANK") == str(rank))


def both_ranks_started(agents: list[subprocess.Popen | ForkedNmt]) -> bool:
    """Both workers exist and run nmt: a worker between its fork and its exec still has its
    agent's environment, without RANK."""
    try:
        return sorted(w.environ().get("RANK", "") for w in workers_of(agents)) == ["0", "1"]
    except psutil.Error:
        return False


def logs(run: Path) -> str:
    return "".join(Path(f"{run}.node{i}.log").read_text()[-3000:] for i in range(2))


def assert_identical_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def unbroken(prepared, tmp_path_factory) -> Path:  # noqa: F811
    run = fresh_copy(prepared, tmp_path_factory.mktemp("unbroken") / "run")
    assert wait_for(start_two_nodes(run)) == [0, 0], logs(run)
    return run


@pytest.mark.slow  # the three torchrun tests: 50-80 s together on two shared cores
def test_two_nodes_equal_one_process_with_update_freq_2(prepared, unbroken, tmp_path):  # noqa: F811
    one = fresh_copy(prepared, tmp_path / "one")
    proc = run_nmt("train", "-r", one, *ARGS, "--update-freq", "2")
    assert proc.returncode == 0, proc.stderr
    assert "2 process(es)" in (unbroken / "logs/train.log").read_text()
    assert_same_params(final_params(one), final_params(unbroken))


def saved_update(run: Path) -> int:
    return load_checkpoint(run / "checkpoints/checkpoint_last.pt")["train_state"]["update"]


def paused_mid_run(prepared: Path, tmp_path: Path, victim: int, *torchrun_args: str) -> tuple[Path, list[subprocess.Popen | ForkedNmt], psutil.Process]:
    """Two nodes training a fresh copy of `prepared`, with rank `victim`'s worker paused (SIGSTOP)
    after a checkpoint and at least two saves before the last one, for the caller to kill: it
    dies mid-run whatever the machine's speed, since the other rank cannot get past the next
    collective (and so past one more save) without it. A kill after the end would leave
    torchrun's agents in their exit barrier, which is not what is under test. The survivor is
    never paused: a gloo peer that dies while the survivor is stopped can leave it waiting in its
    next all-reduce. A run that got further before the test looked is let finish and tried again
    on a new copy."""
    for attempt in range(5):
        run = fresh_copy(prepared, tmp_path / f"run{attempt}")
        agents = start_two_nodes(run, *torchrun_args)
        wait_until(lambda: both_ranks_started(agents), timeout=900, poll=0.02)
        worker = worker_of_rank(agents, victim)
        last = run / "checkpoints/checkpoint_last.pt"
        if paused_in_time(worker.pid, last.exists, lambda: saved_update(run) <= MAX_UPDATE - 2 * SAVE_EVERY):
            return run, agents, worker
        assert wait_for(agents) == [0, 0], logs(run)
    pytest.fail("five runs of two nodes went past their second-last checkpoint before the test could pause them")


@pytest.mark.slow
def test_a_killed_worker_stops_both_nodes_and_a_rerun_resumes_exactly(prepared, unbroken, tmp_path):  # noqa: F811
    run, agents, worker = paused_mid_run(prepared, tmp_path, victim=1)
    worker.kill()
    assert all(wait_for(agents)), logs(run)  # both fail, neither hangs
    saved = saved_update(run)
    assert saved < MAX_UPDATE, "the run ended before the kill"

    assert wait_for(start_two_nodes(run)) == [0, 0], logs(run)
    assert f"resuming from {run}/checkpoints/checkpoint_last.pt at update {saved}," in (run / "logs/train.log").read_text()
    assert_identical_params(final_params(unbroken), final_params(run))


@pytest.mark.slow
def test_max_restarts_restarts_a_killed_worker_which_resumes_by_itself(prepared, unbroken, tmp_path):  # noqa: F811
    run, agents, worker = paused_mid_run(prepared, tmp_path, 0, "--max-restarts", "1")
    worker.kill()  # the writer: it holds the run's lock and saves the checkpoints
    assert wait_for(agents) == [0, 0], logs(run)
    assert "resuming from" in (run / "logs/train.log").read_text()
    assert_identical_params(final_params(unbroken), final_params(run))


def test_a_rank_other_than_0_does_not_refuse_the_run_its_rank_0_holds(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = hold_lock(run, "nmt train -r run")  # rank 0 of the same job, started first
    try:
        rank_1 = run_nmt("train", "-r", run, env={"RANK": "1", "WORLD_SIZE": "2"})
        second_job = run_nmt("train", "-r", run)
    finally:
        holder.kill()
        holder.wait()
    assert "in use by" in second_job.stderr
    assert "in use by" not in rank_1.stderr and "run `nmt preprocess` first" in rank_1.stderr  # past the lock check
