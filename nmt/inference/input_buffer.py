"""Input of `nmt translate` in buffers that end where the input pauses.

A program that writes one line to `nmt translate` and waits for the answer must get it: so
the buffer of lines to sort and translate ends either when it holds `size` lines or when the
input has nothing more to read for a moment (`pause` seconds). A file, or a pipe fed faster
than the model translates, still fills whole buffers, so batching stays efficient.
Pauses are detected with select(), which works on pipes, FIFOs, terminals and sockets on
POSIX; elsewhere (and for .gz files) the input is read in whole buffers as before.
"""

from __future__ import annotations

import os
import select
import stat
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

from nmt.data.textio import decode_line, read_lines, stdin_lines
from nmt.inference.translator import buffers

READ_BYTES = 1 << 16
PAUSE_SECONDS = 0.01
"""How long the input must stay silent to count as a pause: long enough that a pipe being
filled by a fast writer is not cut into small buffers, short enough not to be noticed."""


def input_buffers(path: Optional[Path], stdin: Callable[[], IO[bytes]], size: int, errors: str = "strict",
                  pause: float = PAUSE_SECONDS) -> Iterator[list[str]]:
    """The lines of `path` (or of the stream `stdin()` returns, when None), in buffers of at
    most `size` lines that also end when the input pauses. Every line is yielded once, in order."""
    if path is not None and (path.suffix == ".gz" or not _is_stream(path)):
        yield from buffers(read_lines(path, errors), size)
        return
    if os.name != "posix":
        yield from buffers(stdin_lines(stdin(), errors), size)
        return
    if path is None:
        yield from pausing_buffers(stdin().fileno(), size, errors, "<stdin>", pause)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        yield from pausing_buffers(fd, size, errors, str(path), pause)
    finally:
        os.close(fd)


def _is_stream(path: Path) -> bool:
    """A FIFO or other non-regular file that exists (a missing file is left to read_lines to report)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def pausing_buffers(fd: int, size: int, errors: str = "strict", name: str = "<stdin>",
                    pause: float = PAUSE_SECONDS) -> Iterator[list[str]]:
    """Lines read from file descriptor `fd`, yielded in buffers of at most `size` lines; a
    buffer also ends when `fd` has had nothing to read for `pause` seconds.

    Lines are split on b"\\n" and lose a trailing "\\r", as `textio.stdin_lines` does; a
    last line without a newline counts. A bad byte is an NmtError naming the line.
    """
    held: list[str] = []
    partial = bytearray()  # the line being read; a bytearray so a long line grows in place
    lineno = 0
    while True:
        if held and (len(held) >= size or not _readable(fd, pause)):
            yield held[:size]
            del held[:size]
            continue
        data = os.read(fd, READ_BYTES)
        if not data:
            break
        partial += data
        if b"\n" not in data:
            continue
        *complete, rest = partial.split(b"\n")
        partial = bytearray(rest)
        for raw in complete:
            lineno += 1
            held.append(decode_line(raw, name, lineno, errors).rstrip("\r\n"))
    if partial:
        held.append(decode_line(bytes(partial), name, lineno + 1, errors).rstrip("\r\n"))
    while held:
        yield held[:size]
        del held[:size]


def _readable(fd: int, timeout: float) -> bool:
    """Whether `fd` has data (or end of file) to read within `timeout` seconds."""
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready)
