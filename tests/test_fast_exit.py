"""`nmt translate` skips the interpreter's teardown at its end: never at the cost of output."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_buffered_output_is_flushed_before_the_fast_exit():
    proc = _run("""
        import sys
        from nmt_cli import fast_exit
        sys.stdout.write("translated line\\n" * 3)  # still in the buffer
        sys.stderr.write("note")
        fast_exit.request()
        fast_exit.exit_if_requested()
        print("not reached")
    """)
    assert proc.returncode == 0
    assert proc.stdout == "translated line\n" * 3
    assert proc.stderr == "note"


def test_no_fast_exit_while_a_thread_still_works(tmp_path: Path):
    out = tmp_path / "written"
    proc = _run(f"""
        import threading, time
        from nmt_cli import fast_exit
        def write():
            time.sleep(0.3)
            open({str(out)!r}, "w").write("done")
        threading.Thread(target=write).start()
        fast_exit.request()
        fast_exit.exit_if_requested()
        print("went on")
    """)
    assert proc.returncode == 0
    assert proc.stdout == "went on\n"
    assert out.read_text() == "done"


def test_no_fast_exit_unless_requested():
    proc = _run("""
        from nmt_cli import fast_exit
        fast_exit.exit_if_requested()
        print("went on")
    """)
    assert proc.stdout == "went on\n"
