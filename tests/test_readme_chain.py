"""README's "The whole chain in 5 minutes", run as written: the same `nmt` commands, on a slice of
Multi30k and with fewer updates, each ending well and saying nothing a user would read as an error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SHORTER = {
    "--vocab-size 8000": "--vocab-size 1000",  # a 3000-line slice has fewer pieces than that
    "--max-tokens 2048": "--max-tokens 1024",
    "--warmup 400": "--warmup 30",  # the peak learning rate within the 30 updates
    "--max-time 3m": "--max-time 3m --max-update 30",
    "--save-interval-minutes 0.5": "--save-interval-minutes 0.5 --save-interval-updates 5",
}
"""What the test shortens; every other word of the README's commands stays."""


def readme_chain() -> list[str]:
    """The `nmt` lines of the README section's code block."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## The whole chain in 5 minutes", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    nmt ")]


def test_the_readme_lists_the_whole_chain():
    assert [line.split()[1] for line in readme_chain()] == [
        "preprocess", "train", "average-checkpoints", "translate", "score"]
    for long in SHORTER:
        assert any(long in line for line in readme_chain()), long


@pytest.mark.slow
def test_the_five_minute_chain_works_as_written(small_multi30k, tmp_path):
    shutil.copytree(small_multi30k, tmp_path / "data" / "multi30k")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "D": "data/multi30k"}
    env.pop("NMT_RUN_DIR", None)
    for line in readme_chain():
        for long, short in SHORTER.items():
            line = line.replace(long, short)
        proc = subprocess.run(["bash", "-c", f"set -eo pipefail; {line}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (line, proc.stderr)
        for said in proc.stderr.splitlines():
            assert not any(word in said.lower() for word in ("error", "warning", "traceback")), (line, said)
    assert len((tmp_path / "quick.de").read_text(encoding="utf-8").splitlines()) == 200
