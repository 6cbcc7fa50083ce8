"""`nmt translate` answers each line as soon as it arrives when its input pauses (pipe, FIFO)."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nmt.inference.input_buffer import pausing_buffers
from nmt.inference.translator import SearchConfig, TranslateConfig, load_translator
from conftest import start_nmt
from test_translate import _lines, _make_run

ANSWER_TIMEOUT = 120.0  # seconds; generous for a loaded 2-core machine, but a hang fails


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _make_run(tmp_path_factory.mktemp("run"), _lines(400, 0), 90)


def _read_line(fd: int, pending: bytearray, timeout: float) -> str:
    """One output line, or a test failure when none comes within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while b"\n" not in pending:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            pytest.fail(f"no answer within {timeout:.0f} s: translate waits for more input instead of answering")
        data = os.read(fd, 4096)
        if not data:
            pytest.fail("translate closed its output before answering")
        pending += data
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode("utf-8")


def _translate_args(run_dir: Path, *extra: str) -> list[str]:
    return ["translate", "--threads", "1", "-r", str(run_dir), "--max-len-b", "6", "--quiet", *extra]


def _expected(run_dir: Path, lines: list[str]) -> list[str]:
    translator = load_translator(run_dir, search=SearchConfig(max_len_b=6), cfg=TranslateConfig(device="cpu", threads=1))
    return [t.hyp for t in translator.translate(lines)]


def test_a_pipe_written_one_line_at_a_time_gets_each_answer_before_the_next_line(run_dir):
    lines = _lines(4, 7)
    lines.insert(2, "")
    want = _expected(run_dir, lines)
    proc = start_nmt(*_translate_args(run_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pending = bytearray()
        for line, expected in zip(lines, want):
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()  # and wait: the answer must come while stdin stays open
            assert _read_line(proc.stdout.fileno(), pending, ANSWER_TIMEOUT) == expected
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=ANSWER_TIMEOUT) == 0, proc.stderr.read()
        assert pending == b"" and rest == b""  # N lines in, N lines out
    finally:
        proc.kill()
        proc.wait()


def test_a_fifo_given_as_input_streams_too(run_dir, tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    lines = _lines(3, 8)
    want = _expected(run_dir, lines)
    proc = start_nmt(*_translate_args(run_dir, "--input", str(fifo)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with open(fifo, "wb", buffering=0) as writer:
            pending = bytearray()
            for line, expected in zip(lines, want):
                writer.write(line.encode() + b"\n")
                assert _read_line(proc.stdout.fileno(), pending, ANSWER_TIMEOUT) == expected
        assert proc.wait(timeout=ANSWER_TIMEOUT) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_buffers_end_at_a_pause_and_at_the_size_and_keep_every_line():
    read_fd, write_fd = os.pipe()
    first = b"a\nb\r\n\nc\n"

    def writer():
        os.write(write_fd, first)
        time.sleep(0.5)  # a pause: what was written so far must come out as one buffer
        os.write(write_fd, b"d\ne\nf\ng\nno newline")
        os.close(write_fd)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        got = list(pausing_buffers(read_fd, size=3, pause=0.1))
    finally:
        thread.join()
        os.close(read_fd)
    assert got[0] == ["a", "b", ""]  # size 3 reached
    assert got[1] == ["c"]  # then the pause
    assert [line for chunk in got for line in chunk] == ["a", "b", "", "c", "d", "e", "f", "g", "no newline"]
    assert all(1 <= len(chunk) <= 3 for chunk in got)
