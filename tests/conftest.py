"""Shared test fixtures: the real data in ../shared (skipped where absent) and a CLI runner."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# The test processes share the machine's cores: an OpenMP thread that spins while it waits for
# work (the default) holds a core another test's process needs. They wait passively; the same
# maths, sooner on a loaded machine. Set here, before this process or any it starts loads torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


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


@pytest.fixture(scope="session")
def small_multi30k(multi30k_dir: Path, tmp_path_factory) -> Path:
    """A Multi30k folder as the recipes read it (MULTI30K_DIR), with its first 3000 training pairs
    and 200 of val and of test: a recipe's chain runs the same, on less text to translate."""
    import gzip

    def build(folder: Path) -> None:
        for split, n in (("train", 3000), ("val", 200), ("test_2016_flickr", 200)):
            for lang in ("en", "de"):
                with gzip.open(multi30k_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                    lines = [line for _, line in zip(range(n), f)]
                with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.writelines(lines)

    return built_once(tmp_path_factory, "small_multi30k", build)


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
    if isinstance(input, str):
        input = input.encode("utf-8")
    proc = start_nmt(*args, stdin=subprocess.DEVNULL if input is None else subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, cwd=cwd, env=env)
    done = finish(proc, input, timeout)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode("utf-8", errors="replace"),
                                       done.stderr.decode("utf-8", errors="replace"))


def finish(proc: "subprocess.Popen | ForkedNmt", input: bytes | str | None = None,
           timeout: float | None = None) -> subprocess.CompletedProcess:
    """`proc.communicate(input)` to its end, as subprocess.run: killed if it outlasts `timeout`."""
    try:
        stdout, stderr = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_script(script: str | Path, *args: str, env: dict[str, str], cwd: str | Path | None = None,
               timeout: float = 900) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` with `env` as its whole environment; stdout and stderr as text. Forked
    from the fork server (its imports done once), unless NMT_TEST_FORK=0: the caller vouches that
    nothing in `env` is read at start-up."""
    popen = {"cwd": cwd, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return finish(_start(script, args, env, popen, forkable=True), timeout=timeout)


def start_nmt(*args: str, env: dict[str, str] | None = None, **popen: Any) -> "subprocess.Popen | ForkedNmt":
    """Start the real `nmt` command line (`python -m nmt_cli ARGS`), as subprocess.Popen would with
    `popen`, and with Ctrl-C (SIGINT) raising KeyboardInterrupt, as in a terminal's foreground
    command: a test runner started in the background of a script inherits SIGINT ignored, and
    would pass that on. `env` is added to this process's environment (less NMT_RUN_DIR, unless
    given). Forked from the fork server (ForkedNmt) unless `env` sets something read at start-up,
    `popen` asks for more than ForkedNmt offers, or NMT_TEST_FORK=0."""
    return _start(None, args, _environ_with(env), popen, forkable=set(env or {}) <= FORKABLE_ENV)


def start_script(script: str | Path, *args: str, env: dict[str, str] | None = None, **popen: Any) -> "subprocess.Popen | ForkedNmt":
    """`python SCRIPT ARGS` (a console script such as torchrun's), started as `start_nmt` starts `nmt`."""
    return _start(script, args, _environ_with(env), popen, forkable=set(env or {}) <= FORKABLE_ENV)


def _environ_with(env: dict[str, str] | None) -> dict[str, str]:
    full_env = {k: v for k, v in os.environ.items() if k != "NMT_RUN_DIR"}
    full_env.update(env or {})
    return full_env


def _start(script: str | Path | None, args: tuple, env: dict[str, str], popen: dict[str, Any],
           forkable: bool) -> "subprocess.Popen | ForkedNmt":
    """`python SCRIPT ARGS`, or `python -m nmt_cli ARGS` without a script, with `env` as its whole
    environment: forked when `forkable`, `popen` asks for nothing ForkedNmt lacks and NMT_TEST_FORK
    is not 0; else a real process."""
    argv = [str(a) for a in args]
    if forkable and set(popen) <= ForkedNmt.OPTIONS and os.environ.get("NMT_TEST_FORK", "1") != "0":
        return ForkedNmt(argv, env=env, script=script, **popen)
    command = [str(script)] if script else ["-m", "nmt_cli"]
    return subprocess.Popen([sys.executable, *command, *argv], env=env, preexec_fn=_default_sigint, **popen)


class ForkedNmt:
    """`python -m nmt_cli ARGV` (or `python SCRIPT ARGV`) forked from this test worker's fork server, with the part of
    subprocess.Popen that the tests use: pid, stdin/stdout/stderr (PIPE, DEVNULL, STDOUT, a file,
    or inherited), poll, wait, communicate, send_signal, kill, returncode. The process is the
    fork server's grandchild, not this process's child: its exit status (negative: the signal
    that ended it) comes over the socket, read by a thread."""

    OPTIONS = {"stdin", "stdout", "stderr", "text", "cwd", "start_new_session"}

    def __init__(self, argv: list[str], env: dict[str, str], stdin: Any = None, stdout: Any = None, stderr: Any = None,
                 text: bool = False, cwd: str | Path | None = None, start_new_session: bool = False,
                 script: str | Path | None = None):
        import io
        import json
        import socket
        import threading

        self.args = [sys.executable, *([str(script)] if script else ["-m", "nmt_cli"]), *argv]
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        ours: list[int] = []  # descriptors opened here for the child: closed once it has them
        theirs: list[int] = []
        for i, spec in enumerate((stdin, stdout, stderr)):
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                mine, child = (w, r) if i == 0 else (r, w)
                raw = open(mine, "wb" if i == 0 else "rb")
                end = (io.TextIOWrapper(raw, encoding="utf-8", write_through=True) if i == 0 else
                       io.TextIOWrapper(raw, encoding="utf-8")) if text else raw
                setattr(self, ("stdin", "stdout", "stderr")[i], end)
                ours.append(child)
            elif spec == subprocess.DEVNULL:
                child = os.open(os.devnull, os.O_RDWR)
                ours.append(child)
            elif spec == subprocess.STDOUT:
                child = theirs[1]
            elif spec is None:
                child = i
            else:
                child = spec if isinstance(spec, int) else spec.fileno()
            theirs.append(child)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(_zygote_socket())
        header = {"argv": argv, "env": env, "cwd": str(Path(cwd or os.getcwd()).resolve()), "session": start_new_session,
                  "script": str(script) if script else None}
        socket.send_fds(self._sock, [json.dumps(header).encode() + b"\n"], theirs)
        for fd in ours:
            os.close(fd)
        self._replies = self._sock.makefile("rb")
        self.pid = int(self._replies.readline().split()[1])
        self._done = threading.Event()
        threading.Thread(target=self._await_exit, daemon=True).start()

    def _await_exit(self) -> None:
        line = self._replies.readline()
        self._replies.close()
        self._sock.close()
        assert line.startswith(b"exit "), f"the fork server lost the command: {line!r}"
        self.returncode = int(line.split()[1])
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input: bytes | str | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As Popen.communicate: writes `input` and closes stdin, reads stdout and stderr to their end."""
        import threading

        output: dict[str, Any] = {}

        def read(name: str) -> None:
            with getattr(self, name) as f:
                output[name] = f.read()

        def write() -> None:
            try:
                with self.stdin as f:
                    if input:
                        f.write(input)
            except BrokenPipeError:
                pass

        threads = [threading.Thread(target=read, args=(n,), daemon=True) for n in ("stdout", "stderr") if getattr(self, n)]
        if self.stdin is not None and not self.stdin.closed:
            threads.append(threading.Thread(target=write, daemon=True))
        for t in threads:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return output.get("stdout"), output.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)


_zygote: dict[str, object] = {}


ZYGOTE_ENV = "NMT_TEST_ZYGOTE"
"""The socket of the fork server that a forked script (a recipe under tests/recipe_runner.py) forks its commands from."""


def _zygote_socket() -> str:
    """This test worker's fork server (started at first use, stopped when the worker exits), or
    the one named by $NMT_TEST_ZYGOTE."""
    if os.environ.get(ZYGOTE_ENV):
        return os.environ[ZYGOTE_ENV]
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
    """A `tiny` model trained for 400 updates on 3000 Multi30k pairs: it ends its sentences
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
                      "--seed", "1", "--save-interval-minutes", "0", "--warmup", "50", "--lr", "3e-3", "--max-update", "400")):
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
