"""Operating-system errors a user can fix, as one line that names the path and what to do.

A full disk, a read-only mount, a missing permission, or a path that is a folder where a file
belongs (or the reverse) are not bugs in nmt; they must not end in a traceback.
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from typing import Iterator, Optional

ADVICE = {
    errno.ENOSPC: "free some space there, or write somewhere else (--run-dir, -o)",
    errno.EDQUOT: "free some space there, or write somewhere else (--run-dir, -o)",
    errno.EROFS: "that filesystem is mounted read-only; choose a writable --run-dir or -o",
    errno.EACCES: "check its permissions, or choose another --run-dir or -o",
    errno.EPERM: "check its permissions, or choose another --run-dir or -o",
    errno.EISDIR: "it is a folder; give a file name",
    errno.ENOTDIR: "a part of that path is a file, not a folder; choose another path",
}


def os_error_message(e: OSError) -> Optional[str]:
    """'<what went wrong>: <path>; <advice>' for the errors above, else None (a real bug)."""
    advice = ADVICE.get(e.errno or 0)
    if advice is None:
        return None
    what = e.strerror or errno.errorcode.get(e.errno or 0, "error")
    path = str(e.filename) if e.filename is not None else "standard output or an open output file"
    if e.filename2 is not None:
        path = f"{path} -> {e.filename2}"
    return f"{what[:1].lower()}{what[1:]}: {path}; {advice}"


@contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Give an OSError raised without a file name (a write to, or the close of, an open file)
    the name of `path`, the file being written, so the message names it instead of guessing
    'standard output'."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e
