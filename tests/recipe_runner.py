"""`python tests/recipe_runner.py recipes/NAME.py`: run a recipe as `python recipes/NAME.py` would,
with its `nmt` commands forked from a fork server (tests/zygote.py: the one named by
$NMT_TEST_ZYGOTE, else one of its own) instead of each started as
`python -m nmt_cli`, which pays a Python start and `import torch`. A recipe test starts dozens of
commands; each is still its own process, with the recipe's environment, arguments and output
files. Nothing of the recipe is changed: `subprocess.run` and `subprocess.call` are wrapped, and
any other program they start (a recipe running another recipe) is started as usual.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
NMT = [sys.executable, "-m", "nmt_cli"]

_run, _call = subprocess.run, subprocess.call


def _forked(argv: list[str], stdin: Any = None, stdout: Any = None, stderr: Any = None, capture_output: bool = False,
            text: bool = False, check: bool = False, env: dict[str, str] | None = None, cwd: Any = None,
            timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, ...)` of an `nmt` command, forked; its output goes where the call sent it."""
    from conftest import ForkedNmt, finish

    if capture_output:
        stdout = stderr = subprocess.PIPE
    sys.stdout.flush()
    sys.stderr.flush()
    done = finish(ForkedNmt(argv[len(NMT):], env=dict(os.environ if env is None else env), stdin=stdin, stdout=stdout,
                            stderr=stderr, text=text, cwd=cwd), timeout=timeout)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return subprocess.CompletedProcess(argv, done.returncode, done.stdout, done.stderr)


def _nmt_command(argv: Any, args: tuple) -> bool:
    """Whether a run/call starts `python -m nmt_cli ...` (given as a list, options as keywords)."""
    return not args and isinstance(argv, list) and [str(a) for a in argv[:len(NMT)]] == NMT


def run(argv: Any, *args: Any, **kwargs: Any) -> subprocess.CompletedProcess:
    return _forked([str(a) for a in argv], **kwargs) if _nmt_command(argv, args) else _run(argv, *args, **kwargs)


def call(argv: Any, *args: Any, **kwargs: Any) -> int:
    return _forked([str(a) for a in argv], **kwargs).returncode if _nmt_command(argv, args) else _call(argv, *args, **kwargs)


if __name__ == "__main__":
    recipe = Path(sys.argv[1]).resolve()
    sys.argv = [str(recipe), *sys.argv[2:]]
    sys.path[0] = str(recipe.parent)  # as `python recipes/NAME.py` starts: the recipe's folder first
    sys.path.append(str(TESTS))
    subprocess.run, subprocess.call = run, call
    runpy.run_path(str(recipe), run_name="__main__")
