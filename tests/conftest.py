"""Shared test fixtures: the real data in ../shared (skipped where absent) and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """../shared/data/multi30k; tests that need it skip cleanly in a user's fresh clone."""
    d = SHARED_DATA / "multi30k"
    if not (d / "train.en.gz").is_file():
        pytest.skip("../shared/data/multi30k not present")
    return d


@pytest.fixture(scope="session")
def wmt14_dir() -> Path:
    d = SHARED_DATA / "wmt14"
    if not (d / "newstest2014.de.gz").is_file():
        pytest.skip("../shared/data/wmt14 not present")
    return d


def run_nmt(*args: str, input: bytes | str | None = None, cwd: str | Path | None = None,
            env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real `nmt` command line in a subprocess; returns stdout/stderr as text."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("NMT_RUN_DIR", None) if env is None or "NMT_RUN_DIR" not in env else None
    if isinstance(input, str):
        input = input.encode("utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "nmt_cli", *map(str, args)],
        input=input, capture_output=True, cwd=cwd, env=full_env, timeout=timeout,
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode,
        proc.stdout.decode("utf-8", errors="replace"), proc.stderr.decode("utf-8", errors="replace"),
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """A user error: non-zero exit, exactly one line on stderr, no traceback, naming `needles`."""
    assert proc.returncode != 0, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
