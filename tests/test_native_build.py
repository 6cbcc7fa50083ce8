"""The C++ decoder kernels' build (nmt.ops.native): it cannot hang, surprise or write where it
must not, whatever happened to an earlier build (#66: K1, K16, K17)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_script
from nmt.ops import native

LOAD = str(Path(__file__).with_name("native_load.py"))
"""A script that loads the kernels as a command does and prints `built|none` and whether torch's builder was imported."""


def _load(extensions: Path, **env: str) -> subprocess.CompletedProcess:
    """LOAD in a process of its own (forked from the tests' fork server, which never loaded the
    kernels nor imported torch's builder), with TORCH_EXTENSIONS_DIR=`extensions` and `env`."""
    environ = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), **env}
    environ.pop(native.DISABLE_ENV, None)
    return run_script(LOAD, env=environ)


def _tree(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def finished_build() -> Path:
    """This machine's finished build (conftest builds it before the tests), or a skip."""
    if native.native_module() is None:
        pytest.skip("the C++ kernels cannot be built on this machine")
    return native.extensions_root() / native.build_name()


def test_a_build_killed_midway_does_not_block_the_next_one(tmp_path):
    """K1: a SIGKILL during a real build (the OOM killer, `timeout -s KILL`) used to leave torch's
    lock file behind, and every later model load waited for it forever. The next load must take
    the lock, clear the dead build's folder and build anew; whether its compiler then succeeds is
    not what a kill changes (the session's own build proves that), so a compiler that fails at once
    stands in for the half-minute compile."""
    if native._missing_tools() is not None:
        pytest.skip(native._missing_tools())
    extensions = tmp_path / "extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    env.pop(native.DISABLE_ENV, None)
    first = subprocess.Popen([sys.executable, LOAD], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    deadline = time.monotonic() + 600
    while not list(extensions.glob(".nmt_native_*.build-*/build.ninja")):  # the compiler is about to run
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGKILL)  # the build's ninja and compiler too: no orphan compiles on
    first.wait(timeout=900)
    first.stderr.close()
    assert list(extensions.glob(".nmt_native_*.build-*")), "the killed build left nothing: it finished first"

    again = _load(extensions, CXX=str(_failing_compiler(tmp_path)))  # subprocess.run's timeout bounds a wait
    assert again.returncode == 0 and again.stdout.split()[0] == "none", again.stderr
    assert "waiting for another process" not in again.stderr  # the dead builder's lock was free
    assert "building the C++ decoder kernels" in again.stderr and "error: no such header" in again.stderr
    assert not list(extensions.glob(".nmt_native_*.build-*")), "the killed build's folder was not removed"


def _failing_compiler(folder: Path) -> Path:
    """A C++ compiler that fails every compile (missing headers, say), counting its calls in
    folder/calls; torch's builder asks it its version first, and that much it answers."""
    compiler = folder / "broken-c++"
    compiler.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) ;; *) exec c++ "$@";; esac\n'
                        f"echo x >> {folder / 'calls'}\necho 'main.cpp:1:1: fatal error: no such header' >&2\nexit 1\n")
    compiler.chmod(0o755)
    return compiler


def test_a_finished_build_in_a_read_only_folder_loads_without_writing(tmp_path, finished_build):
    """K17: torch's loader had to create its lock file, so a read-only cache (a shared image,
    a container layer) fell back to the slower ops; and it imported torch's builder, whose
    import prints a CUDA_HOME warning on CPU-only machines."""
    shared = tmp_path / "extensions"
    shutil.copytree(finished_build, shared / finished_build.name)
    for path in [shared, *shared.rglob("*")]:
        path.chmod(path.stat().st_mode & 0o555)
    before = _tree(shared)
    try:
        proc = _load(shared)
    finally:
        for path in [shared, *shared.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert proc.returncode == 0 and proc.stdout.split() == ["built", "False"], proc.stderr
    assert proc.stderr == ""
    assert _tree(shared) == before


def test_without_a_compiler_one_line_says_so_on_every_run(tmp_path):
    """K16: torch's builder printed its compiler banner between nmt's two lines."""
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    for _ in range(2):
        proc = _load(tmp_path / "extensions", PATH=str(empty_path))
        assert proc.returncode == 0 and proc.stdout.split() == ["none", "False"], proc.stderr
        assert proc.stderr.count("\n") == 1 and "C++ decoder kernels cannot be built here (no C++ compiler" in proc.stderr
        assert "decoding with the PyTorch ops" in proc.stderr


def test_a_failed_build_is_said_in_one_line_and_not_retried_on_every_run(tmp_path):
    """A compiler that fails (missing headers, say) costs one attempt, not one per command; the
    line says how to try again."""
    if shutil.which("ninja") is None:
        pytest.skip("ninja is not on PATH")
    calls = tmp_path / "calls"
    compiler = _failing_compiler(tmp_path)
    runs = [_load(tmp_path / "extensions", CXX=str(compiler)) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0 and proc.stdout.split()[0] == "none", proc.stderr
        [line] = [line for line in proc.stderr.splitlines() if "cannot be built" in line]
        assert "error: no such header" in line and "to try again" in line
    assert "building the C++ decoder kernels" not in runs[1].stderr and runs[1].stderr.count("\n") == 1
    compiled = calls.read_text().count("x")
    assert compiled >= 1 and not list((tmp_path / "extensions").glob(".nmt_native_*.build-*"))
    _load(tmp_path / "extensions", CXX=str(compiler))
    assert calls.read_text().count("x") == compiled  # the later runs did not call the compiler


def test_a_build_that_does_not_load_is_one_line_not_a_traceback(tmp_path):
    """A build copied from another system (its libraries differ) or damaged by hand: the PyTorch
    ops decode, and one line says what to remove."""
    name = native.build_name()
    (tmp_path / name).mkdir()
    (tmp_path / name / f"{name}.so").write_bytes(b"not a shared object")
    proc = _load(tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["none", "False"], proc.stderr
    assert proc.stderr.count("\n") == 1 and "does not load" in proc.stderr and f"remove {tmp_path / name}" in proc.stderr
