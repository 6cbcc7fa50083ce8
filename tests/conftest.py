"""Shared test fixtures: the real data in ../shared (skipped where absent) and a CLI runner."""

from __future__ import annotations

import contextlib
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
    _one_thread_per_worker()


def _one_thread_per_worker() -> None:
    """With a test worker per core (`make test`: TEST_WORKERS 2), PyTorch's default of a thread per core
    in each worker oversubscribes the cores: an OpenMP team spins at every small op for a thread
    the other worker's process holds off its core, and a 2-second in-process training test took
    16-23 s. So each worker's own torch gets one thread; a test about threads sets its own. The
    `nmt` commands the tests start keep their defaults."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and workers >= (os.cpu_count() or 1):
        torch.set_num_threads(1)


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


FORKABLE_ENV = {"NMT_RUN_DIR", "RANK", "WORLD_SIZE", "TORCH_EXTENSIONS_DIR"}
"""Variables a command reads when it runs, not at start-up: a command given others is a real process."""


def run_nmt(*args: str, input: bytes | str | None = None, cwd: str | Path | None = None,
            env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real `nmt` command line in its own process; returns stdout/stderr as text. The
    process is forked from this test worker's fork server (tests/zygote.py), which imported the
    command line once, unless `env` sets something read at start-up."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("NMT_RUN_DIR", None) if env is None or "NMT_RUN_DIR" not in env else None
    if isinstance(input, str):
        input = input.encode("utf-8")
    argv = [str(a) for a in args]
    if set(env or {}) <= FORKABLE_ENV and os.environ.get("NMT_TEST_FORK", "1") != "0":
        stdout, stderr, code = _run_forked(argv, input, cwd, full_env, timeout)
    else:
        proc = subprocess.run([sys.executable, "-m", "nmt_cli", *argv], input=input, capture_output=True, cwd=cwd,
                              env=full_env, timeout=timeout)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "nmt_cli", *argv], code,
        stdout.decode("utf-8", errors="replace"), stderr.decode("utf-8", errors="replace"),
    )


_zygote: dict[str, object] = {}


def _zygote_socket() -> str:
    """This test worker's fork server (started at first use, stopped when the worker exits)."""
    if "path" not in _zygote:
        import atexit
        import tempfile

        folder = tempfile.mkdtemp(prefix="nmt-zygote-")
        path = os.path.join(folder, "socket")
        env = {k: v for k, v in os.environ.items() if k != "NMT_RUN_DIR"}
        server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py")), path],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  cwd=Path(__file__).parent.parent, env=env)
        ready = server.stdout.readline()
        assert ready == b"ready\n", f"the tests' fork server did not start ({server.poll()})"

        def stop() -> None:
            server.kill()
            server.wait()
            shutil.rmtree(folder, ignore_errors=True)

        atexit.register(stop)
        _zygote.update(path=path, server=server)
    return str(_zygote["path"])


def _run_forked(argv: list[str], input: bytes | None, cwd: str | Path | None, env: dict[str, str],
                timeout: float) -> tuple[bytes, bytes, int]:
    """`python -m nmt_cli ARGV` as a child of the fork server: (stdout, stderr, exit status)."""
    import json
    import signal
    import socket
    import threading

    stdin_r, stdin_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), -1)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(_zygote_socket())
        header = json.dumps({"argv": argv, "env": env, "cwd": str(Path(cwd or os.getcwd()).resolve())}).encode() + b"\n"
        socket.send_fds(sock, [header], [stdin_r, out_w, err_w])
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        replies = sock.makefile("rb")
        pid = int(replies.readline().split()[1])
        output: dict[int, bytes] = {}

        def read(fd: int) -> None:
            with open(fd, "rb") as f:
                output[fd] = f.read()

        def write() -> None:
            with open(stdin_w, "wb") as f:
                try:
                    f.write(input)
                except BrokenPipeError:
                    pass

        threads = [threading.Thread(target=read, args=(fd,), daemon=True) for fd in (out_r, err_r)]
        if input is not None:
            threads.append(threading.Thread(target=write, daemon=True))
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(["nmt", *argv], timeout)
        line = replies.readline()
        assert line.startswith(b"exit "), f"the fork server lost the command: {line!r}"
        return output[out_r], output[err_r], int(line.split()[1])


def start_nmt(*args: str, **popen: object) -> subprocess.Popen:
    """Start the real `nmt` command line in the background (for tests that interrupt it), with
    Ctrl-C (SIGINT) at its default, as a terminal's foreground command has it: a test runner started
    in the background of a script inherits SIGINT ignored, and would pass that on."""
    return subprocess.Popen([sys.executable, "-m", "nmt_cli", *map(str, args)], preexec_fn=_default_sigint, **popen)


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(condition: Callable[[], bool], timeout: float = 120, poll: float = 0.01) -> None:
    """Poll `condition` until it holds or `timeout` seconds pass (the test's next assertion says which)."""
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        time.sleep(poll)


def paused_in_time(pid: int, reached: Callable[[], bool], in_time: Callable[[], bool], timeout: float = 900,
                   group: bool = False) -> bool:
    """Wait until `reached()`, then pause process `pid` (SIGSTOP; with `group`, its whole process
    group, workers included) and say whether `in_time()` still holds: a test that signals a run
    "mid-work" checks that it is, with the run frozen, instead of assuming that this process was
    scheduled in time (a loaded machine can let the run finish first). True: the process stays
    paused, for the caller to signal and resume (SIGCONT). False: it was resumed; the caller
    starts again on a fresh copy."""
    import signal

    send = os.killpg if group else os.kill
    wait_until(reached, timeout=timeout, poll=0.005)
    try:
        send(pid, signal.SIGSTOP)
    except ProcessLookupError:  # it exited, and was reaped
        return False
    if in_time():
        return True
    with contextlib.suppress(ProcessLookupError):
        send(pid, signal.SIGCONT)
    return False


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

    base = tmp_path_factory.getbasetemp()  # under xdist, one per worker: their parent is this test run's
    shared = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "built-once"
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
