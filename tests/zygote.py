"""A fork server for the tests' `nmt` command lines: `python -m nmt_cli` costs a Python start and
`import torch` (seconds on a loaded two-core machine), paid hundreds of times per test run. One
server per test worker imports the command line once, untouched by any test, and forks a child
per command: the child takes the command's stdin, stdout, stderr, environment, working folder
and arguments, runs `nmt_cli` as `python -m` would, and exits with its status; the server
reports the child's pid, then its exit status (negative: the signal that ended it), as
subprocess does.

What a fork cannot give a command falls back to a real process (see `conftest.run_nmt`): an
environment that the interpreter or torch read at start-up (PYTHON*, OMP_*, a hidden torch).

Protocol, one connection per command: the client sends a JSON header (argv, env, cwd; `session`:
start a new session, as Popen's start_new_session; `script`: run `python SCRIPT ARGV` instead)
with its three file descriptors (SCM_RIGHTS), then reads one line "pid N" and one line "exit N".
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import socket
import sys
import traceback


def _run_child(argv: list[str], env: dict[str, str], cwd: str, script: str | None = None) -> int:
    """In the forked child: become `python -m nmt_cli ARGV` (or `python SCRIPT ARGV`) and return
    its exit status."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, as in a terminal
    sys.path[0] = os.path.dirname(os.path.abspath(script)) if script else os.getcwd()  # as python starts
    sys.argv = [script or "nmt_cli", *argv]
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module("nmt_cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # as the interpreter does: die by the signal
        _flush_and_run_atexit()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    _flush_and_run_atexit()
    return code


def _flush_and_run_atexit() -> None:
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _monitor(conn: socket.socket, header: dict, fds: list[int]) -> None:
    """In a forked monitor: fork the command, report its pid and then its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if header.get("session"):
            os.setsid()
        code = 1
        try:
            code = _run_child(header["argv"], header["env"], header["cwd"], header.get("script"))
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"pid {pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    conn.close()


def serve(path: str) -> None:
    # What the commands import when they run (they import lazily, for a fast --help), once.
    import nmt_cli.main  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim imports it at the first optimizer: seconds per `nmt train`)
    import sacrebleu  # noqa: F401
    import sentencepiece  # noqa: F401
    import nmt.average  # noqa: F401
    import nmt.export  # noqa: F401
    import nmt.inference.checkpoints  # noqa: F401
    import nmt.inference.translator  # noqa: F401
    import nmt.preprocess.pipeline  # noqa: F401
    import nmt.score  # noqa: F401
    import nmt.train.loop  # noqa: F401
    # ...and the libraries that some commands import when they need them (tenths of a second each).
    import ctranslate2.converters  # noqa: F401  (export; it imports transformers)
    import matplotlib.backends.backend_agg  # noqa: F401  (train's learning curves, nmt plot)
    import matplotlib.figure  # noqa: F401
    import psutil  # noqa: F401
    import rich.console  # noqa: F401
    import sacremoses  # noqa: F401  (score --tokenize, preprocess --moses)
    # torch.library's finalizers deregister the server's ops at exit: pointless in a child that
    # is about to end, and tens of milliseconds of its exit; the command's own finalizers still run.
    import weakref

    for finalizer in list(weakref.finalize._registry):
        finalizer.atexit = False
    # The server's objects (torch, transformers, ...) go to the collector's permanent generation:
    # a child's collections (`nmt translate` runs one before it translates) scan the command's own
    # objects, as in a process of its own, and leave the server's pages shared.
    gc.collect()
    gc.freeze()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while not msg.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            msg += chunk
        try:
            header = json.loads(msg.decode())
        except ValueError:  # a client that went away
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            server.close()
            try:
                _monitor(conn, header, fds)
            finally:
                os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    serve(sys.argv[1])
