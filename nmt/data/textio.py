"""Reading parallel text: plain or gzip, strict UTF-8 with the line number of a bad byte."""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import IO, Any, Iterator, Optional, Sequence

from nmt.errors import NmtError


def open_binary(path: str | Path) -> IO[bytes]:
    """Open `path` for reading bytes, decompressing `.gz` transparently."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"file not found: {path}")
    if path.suffix == ".gz":
        return CheckedGzip(path)  # type: ignore[return-value]
    return open(path, "rb", buffering=1 << 20)


class CheckedGzip:
    """A `.gz` file read as bytes, whose damage is a user error naming the file and the line.

    Python reports a file that is not gzip as BadGzipFile, a truncated one as EOFError
    (which click turns into a bare "Aborted!") and corrupt data as zlib.error, none of them
    saying which file or how far it got. Lines are counted as they are read, by iteration or
    by `read`: the line named is the last one whole before the damage.
    """

    def __init__(self, path: Path):
        self.path = path
        self.lines = 0
        self._f = gzip.open(path, "rb")

    def _damaged(self, e: BaseException) -> NmtError:
        reason = str(e) or type(e).__name__
        if self.lines == 0 and isinstance(e, gzip.BadGzipFile):
            return NmtError(f"{self.path} is not gzip data ({reason}), though its name ends in .gz; "
                            f"decompress or rename it")
        if isinstance(e, EOFError):  # the stream stops before its end marker: a cut download or copy
            reason = f"truncated: {reason[:1].lower()}{reason[1:]}"
        return NmtError(f"{self.path} is damaged after line {self.lines} ({reason}); "
                        f"download or compress it again")

    def __iter__(self) -> Iterator[bytes]:
        try:
            for line in self._f:
                self.lines += 1
                yield line
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise self._damaged(e) from None

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (-1: all), gathered piece by piece (`read1`) and counted as they
        come, so damage is reported after the last line decompressed, not the last block returned."""
        pieces: list[bytes] = []
        wanted = size if size >= 0 else float("inf")
        try:
            while wanted > 0:
                piece = self._f.read1(int(min(wanted, 1 << 20)))
                if not piece:
                    break
                self.lines += piece.count(b"\n")
                pieces.append(piece)
                wanted -= len(piece)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise self._damaged(e) from None
        return b"".join(pieces)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "CheckedGzip":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def decode_line(raw: bytes, path: str | Path, lineno: int, errors: str = "strict") -> str:
    """Decode one line; a bad byte is a user error naming the file and 1-based line."""
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise NmtError(
            f"invalid UTF-8 in {path} at line {lineno} (byte {e.start}); fix the file or pass "
            f"--encoding-errors replace"
        ) from None


def decode_block(block: bytes, path: str | Path, first_lineno: int, errors: str = "strict",
                 linenos: Sequence[int] | None = None) -> list[str]:
    """Decode a block of whole lines (each ending in b"\\n", the last one may not) at once.

    One `bytes.decode` per block instead of one per line keeps binarization fast; a bad byte
    is still reported with its file and 1-based line: `first_lineno` + the lines before it, or
    `linenos[i]` for the block's i-th line when the block holds non-consecutive lines.
    """
    try:
        text = block.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        index = block.count(b"\n", 0, e.start)
        lineno = linenos[index] if linenos is not None else first_lineno + index
        column = e.start - (block.rfind(b"\n", 0, e.start) + 1)
        raise NmtError(
            f"invalid UTF-8 in {path} at line {lineno} (byte {column}); fix the file or pass "
            f"--encoding-errors replace"
        ) from None
    # Split on "\n" only, as the line count does: str.splitlines() would also split on
    # U+2028 and friends and misalign source and target.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line.rstrip("\r") for line in lines]
    return lines


def read_lines(path: str | Path, errors: str = "strict") -> Iterator[str]:
    """Yield the lines of `path` without their line ends."""
    with open_binary(path) as f:
        for lineno, raw in enumerate(f, 1):
            yield decode_line(raw, path, lineno, errors).rstrip("\r\n")


def count_lines(path: str | Path) -> int:
    """Count lines quickly, reading in 1 MiB blocks (a last line without newline counts)."""
    n = 0
    last = b"\n"
    with open_binary(path) as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def stdin_lines(stream: IO[bytes], errors: str = "strict", name: str = "<stdin>") -> Iterator[str]:
    """Yield decoded lines of a binary stream, naming the line of any bad byte."""
    for lineno, raw in enumerate(stream, 1):
        yield decode_line(raw, name, lineno, errors).rstrip("\r\n")


def lone_surrogate(text: str) -> Optional[str]:
    """Where `text` holds a lone surrogate ("\\ud800": Python strings and JSON allow one, but it is
    no character and no tokenizer reads it), the words for it: "'\\ud800' at character 3"; else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"{text[e.start]!r} at character {e.start}"
    return None


def text_stdout() -> io.TextIOWrapper:
    """A UTF-8 line-buffered text stdout, whatever the locale says."""
    import sys

    return io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", line_buffering=False, newline="\n")
