"""The `nmt` command itself: what a newcomer types before any subcommand."""

from __future__ import annotations

import re
from importlib.metadata import version

from conftest import run_nmt


def test_version_prints_the_installed_version():
    for flag in ("--version", "-V"):
        proc = run_nmt(flag)
        assert proc.returncode == 0 and proc.stdout == f"nmt {version('nmt')}\n" and proc.stderr == ""


def test_help_lists_the_chain_in_the_order_it_runs():
    proc = run_nmt("--help")
    assert proc.returncode == 0
    listed = re.findall(r"^│ ([a-z][a-z-]+) ", proc.stdout, flags=re.M)
    assert listed[:5] == ["preprocess", "train", "average-checkpoints", "translate", "score"], listed
    assert {"export", "serve", "import", "archs", "plot"} <= set(listed[5:])
