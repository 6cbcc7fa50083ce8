"""One writer per run directory: a second writer is refused naming the first; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_nmt
from nmt.errors import NmtError
from nmt.run.lock import RunLock, lock_path


def hold_lock(run_dir: Path, command: str) -> subprocess.Popen:
    """Another process holding `run_dir` (as `nmt train` will); returns once the lock is held."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from nmt.run.lock import RunLock
        with RunLock(Path({str(run_dir)!r}), {command!r}):
            print("held", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout.readline() == b"held\n"
    return proc


@pytest.fixture
def holder(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    proc = hold_lock(run, "nmt train -r run --arch tiny")
    yield run, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_second_writer_is_refused_naming_the_holder(holder, tmp_path: Path):
    run, proc = holder
    (tmp_path / "c.en").write_text("a b\n")
    (tmp_path / "c.de").write_text("x y\n")
    before = sorted(p.name for p in run.iterdir())
    out = run_nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "c", "--vocab-size", "20", "-r", run)
    assert_one_line_error(out, f"pid {proc.pid}", "nmt train -r run --arch tiny", "since")
    assert sorted(p.name for p in run.iterdir()) == before  # nothing staged, nothing written


def test_average_checkpoints_into_a_held_run_is_refused(holder):
    run, proc = holder
    out = run_nmt("average-checkpoints", "-r", run, "--inputs", "checkpoint_1_10.pt", "checkpoint_1_20.pt")
    assert_one_line_error(out, f"pid {proc.pid}")
    assert not (run / "checkpoints").exists()


def test_a_lock_left_by_a_killed_holder_is_taken_over_with_a_note(holder):
    run, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (run / ".lock").is_file()  # the file stays; the kernel dropped the lock itself
    notes = []
    with RunLock(run, "nmt preprocess", note=notes.append) as lock:
        held = json.loads((run / ".lock").read_text())
        assert held["pid"] == os.getpid() and held["command"] == "nmt preprocess"
        assert lock.path == run / ".lock"
    assert len(notes) == 1 and f"pid {proc.pid}" in notes[0] and "no longer running" in notes[0]
    assert not (run / ".lock").exists()  # released: removed


def test_the_same_process_cannot_hold_a_run_twice(tmp_path: Path):
    with RunLock(tmp_path, "first"):
        with pytest.raises(NmtError, match="already being written by this process"):
            with RunLock(tmp_path, "second"):
                pass
    with RunLock(tmp_path, "again"):  # released, so free again
        pass


def test_a_run_dir_that_does_not_exist_is_locked_beside_it_and_not_created(tmp_path: Path):
    run = tmp_path / "new"
    assert lock_path(run) == tmp_path / ".new.lock"
    with RunLock(run, "nmt preprocess"):
        assert (tmp_path / ".new.lock").is_file()
        assert not run.exists()
    assert not (tmp_path / ".new.lock").exists()
