"""Shared test fixtures: the real data in ../shared (skipped where absent) and a CLI runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    """Build the C++ decoder kernels (nmt.ops.native) before any test runs: on a
    machine that has none cached yet, the first model load would otherwise build it inside
    some test and print its one line about that into the output the test checks. Where it
    cannot be built (no compiler), said once here, the commands the tests run are told to
    decode with the PyTorch step rather than each try the build and say so again."""
    from nmt.ops.native import DISABLE_ENV, native_module

    if native_module() is None:
        os.environ[DISABLE_ENV] = "0"


@pytest.fixture
def one_thread():
    """Tiny models: a second thread only adds synchronisation (and the test machine is shared).
    A module asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def torch_blocked_env(folder: Path) -> dict[str, str]:
    """An environment in which `import torch` fails: a package of that name, first on the
    path, that raises. A command that works in it never loaded torch."""
    fake = folder / "no_torch" / "torch"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text('raise ImportError("torch was imported where it must not be")\n')
    path = [str(folder / "no_torch"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path)}


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


def start_nmt(*args: str, **popen: object) -> subprocess.Popen:
    """Start the real `nmt` command line in the background (for tests that interrupt it)."""
    return subprocess.Popen([sys.executable, "-m", "nmt_cli", *map(str, args)], **popen)


def wait_until(condition: Callable[[], bool], timeout: float = 120, poll: float = 0.01) -> None:
    """Poll `condition` until it holds or `timeout` seconds pass (the test's next assertion says which)."""
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        time.sleep(poll)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """A user error: non-zero exit, exactly one line on stderr, no traceback, naming `needles`."""
    assert proc.returncode != 0, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`build(folder)` run once per test run, not once per xdist worker: the first worker to ask
    builds it under a lock in the folder the workers' temporary folders share; the others wait
    for it and use it (read it only: copy it to change it)."""
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent / "built-once"
    shared.mkdir(exist_ok=True)
    folder, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def trained_tiny_run(multi30k_dir: Path, tmp_path_factory) -> Path:
    """A `tiny` model trained for half a minute on 3000 Multi30k pairs: it ends its sentences
    with eos, as a real model does, which a random model almost never does."""
    import gzip

    def build(root: Path) -> None:
        for split, n in (("train", 3000), ("val", 100)):
            for lang in ("en", "de"):
                with gzip.open(multi30k_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                    (root / f"{split}.{lang}").write_text("".join(line for _, line in zip(range(n), f)), encoding="utf-8")
        for args in (("preprocess", "-s", "en", "-t", "de", "--trainpref", root / "train", "--validpref", root / "val",
                      "--vocab-size", "1000", "--workers", "1"),
                     ("train", "--arch", "tiny", "--amp", "none", "--max-tokens", "1024", "--threads", "1", "--no-progress-bar",
                      "--seed", "1", "--save-interval-minutes", "0", "--warmup", "50", "--lr", "3e-3", "--max-update", "600")):
            proc = run_nmt(args[0], "-r", root / "run", *args[1:])
            assert proc.returncode == 0, proc.stderr

    return built_once(tmp_path_factory, "trained_tiny", build) / "run"


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """A preprocessed run directory with a joint vocabulary of 100 pieces (training tests copy it:
    `fresh_copy`)."""
    from test_train import write_corpus

    def build(root: Path) -> None:
        write_corpus(root / "text")
        proc = run_nmt("preprocess", "-r", root / "run", "-s", "en", "-t", "de", "--trainpref", root / "text/train",
                       "--validpref", root / "text/valid", "--vocab-size", "100", "--workers", "1")
        assert proc.returncode == 0, proc.stderr

    return built_once(tmp_path_factory, "prepared", build) / "run"
