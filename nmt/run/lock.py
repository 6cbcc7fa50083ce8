"""One writer per run directory: an advisory lock file that names its holder.

Two commands writing one run directory at once (two `nmt train`, or `nmt preprocess --force`
under a running train) interleave logs and overwrite each other's checkpoints without a word.
Every command that writes a run directory therefore holds `RUN/.lock` while it works:

- The lock is a POSIX record lock (`fcntl.lockf`). The kernel drops it when the holder dies,
  however it dies (SIGKILL, OOM), so a lock can never outlive its process. Unlike `flock`,
  it is not inherited by forked worker processes, which may outlive a killed parent briefly.
- The file holds the holder's pid, command line and start time as JSON, so a second writer
  is told who holds the run directory and since when.
- The holder removes the file when it is done. A file that is still there but not locked was
  left by a holder that died; the next writer takes it over and says so.

Readers (translate, score, plot reading the log) take no lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from nmt.errors import NmtError

LOCK_NAME = ".lock"

_held_here: set[str] = set()
"""Lock files this process holds: POSIX locks do not exclude their own process, and closing
any descriptor of the file would release them, so a second lock in-process is refused here."""


def lock_path(run_dir: Path) -> Path:
    """RUN/.lock; for a run directory that does not exist yet, `.RUN.lock` beside it, so that
    taking the lock does not create the directory (a failed command must leave no trace)."""
    run_dir = Path(run_dir).absolute()
    if run_dir.is_dir():
        return run_dir / LOCK_NAME
    return run_dir.parent / f".{run_dir.name}{LOCK_NAME}"


def _describe(holder: dict[str, Any]) -> str:
    since = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "an unknown time"
    return f"pid {holder.get('pid', '?')} (`{holder.get('command', '?')}`, since {when})"


def _read_holder(fd: int) -> Optional[dict[str, Any]]:
    """The JSON a holder wrote, or None when the file is empty or not ours."""
    try:
        data = os.pread(fd, 1 << 16, 0)
        holder = json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _note(message: str) -> None:
    print(f"nmt: note: {message}", file=sys.stderr, flush=True)


class RunLock:
    """Hold the run directory `run_dir` for one writing `command` (a context manager).

    A run directory held by a live process is a user error naming that process; a lock file
    left by a dead process is taken over with a note (`note`, default: one line on stderr).
    """

    def __init__(self, run_dir: Path, command: str, note: Callable[[str], None] = _note):
        self.run_dir = Path(run_dir)
        self.command = command
        self.note = note
        self.path: Optional[Path] = None
        self._fd: Optional[int] = None

    def __enter__(self) -> "RunLock":
        path = lock_path(self.run_dir)
        if str(path) in _held_here:
            raise NmtError(f"{self.run_dir} is already being written by this process; one writer at a time")
        if not path.parent.is_dir():
            # The run directory's parent does not exist either: nothing can be writing there yet,
            # and the command that creates it reports a bad path itself.
            return self
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    os.close(fd)
                    raise
                holder = _read_holder(fd)
                os.close(fd)
                who = _describe(holder) if holder else "another process (starting up)"
                raise NmtError(f"{self.run_dir} is in use by {who}; wait for it to finish, "
                               f"or stop it, or use another --run-dir") from None
            # The previous holder may have removed the file between our open and our lock:
            # then we hold a lock on a file nobody else can see, so start again.
            # Or the run directory was created meanwhile, and its lock now lives inside it.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino and lock_path(self.run_dir) == path
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
            path = lock_path(self.run_dir)
        stale = _read_holder(fd)
        if stale is not None:
            self.note(f"{self.run_dir} was locked by {_describe(stale)}, which is no longer running; taking it over")
        record = json.dumps({"pid": os.getpid(), "command": self.command, "started": time.time()}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode("utf-8"), 0)
        self.path, self._fd = path, fd
        _held_here.add(str(path))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> None:
        """Remove the lock file, then drop the lock (in that order: see `__enter__`)."""
        if self._fd is None or self.path is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass  # a read-only or vanished directory: the kernel lock still goes with the fd
        _held_here.discard(str(self.path))
        os.close(self._fd)
        self._fd = None


def refuse_if_held(run_dir: Path) -> None:
    """Fail at once, naming the holder, when another process writes `run_dir`; holds nothing.

    For commands whose start-up is slow (importing torch takes seconds): a second writer is
    told right away instead of after loading everything. The lock itself is taken later.
    """
    path = lock_path(run_dir)
    if str(path) in _held_here or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # unreadable or gone: taking the lock later reports it
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                return
            holder = _read_holder(fd)
            who = _describe(holder) if holder else "another process (starting up)"
            raise NmtError(f"{run_dir} is in use by {who}; wait for it to finish, "
                           f"or stop it, or use another --run-dir") from None
    finally:
        os.close(fd)


def command_line() -> str:
    """The command line of this process, as a person would type it (`nmt train -r run`)."""
    args = sys.argv[1:]
    return " ".join(["nmt", *args]) if args else "nmt"
