"""What the recipes share: settings from the environment, visible steps, downloads, the summary.

A recipe is a short list of `Step`s. Each step is shown before it runs as the exact
`nmt ...` command (so a user can copy it and run it alone) or, for the few steps done in
Python (download, gathering text, the summary), as one sentence saying what it does.
Re-running a recipe is safe: `nmt preprocess` is a no-op on the same settings, `nmt train`
resumes from checkpoint_last.pt or does nothing when finished, downloads and gathered text
are kept, and the cheap later steps (average, translate, score, plot) are simply redone.

Errors a user can fix (no network, a missing file, a failed step) end the recipe with one
line on stderr, `RECIPE: error: ...`, and exit status 1.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional


class RecipeError(Exception):
    """A problem the user can fix; the message is one line saying what is wrong and what to do."""


# ---------------------------------------------------------------------------------------
# Settings: a dict of defaults, each overridable by the environment variable of its name
# ---------------------------------------------------------------------------------------

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def parse_setting(name: str, text: str, default: Any) -> Any:
    """`text` (an environment value) read as the type of `default`; None defaults stay text."""
    text = text.strip()
    try:
        if isinstance(default, bool):
            if text.lower() in TRUE_WORDS | FALSE_WORDS:
                return text.lower() in TRUE_WORDS
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = {bool: "1 or 0", int: "an integer", float: "a number"}[type(default)]
        raise RecipeError(f"{name}={text!r} is not {kind}") from None
    return text


def settings_from_env(defaults: dict[str, Any], environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """`defaults` with every key that is set (non-empty) in the environment replaced."""
    environ = os.environ if environ is None else environ
    settings = dict(defaults)
    for name, default in defaults.items():
        value = environ.get(name)
        if value is not None and value.strip() != "":
            settings[name] = parse_setting(name, value, default)
    return settings


def flag_value(value: Any) -> str:
    """A setting as a command-line value: 1e-3 stays readable as 0.001, 3.0 becomes 3."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


# ---------------------------------------------------------------------------------------
# Steps: shown as the exact command, then run
# ---------------------------------------------------------------------------------------


def command_line(args: list[Any], stdout: Optional[Path] = None) -> str:
    """The `nmt ...` line a user can paste into a shell (with the venv's bin on PATH)."""
    line = shlex.join(["nmt", *map(str, args)])
    return f"{line} > {shlex.quote(str(stdout))}" if stdout is not None else line


@dataclass
class Step:
    """One step of a recipe: an `nmt` command, or Python work described in one sentence.

    `prepare`, run just before the step (never in a dry run), may adjust `args` from what
    earlier steps produced (e.g. how many checkpoints exist) and may return a reason to skip.
    """

    title: str
    args: list[Any] = field(default_factory=list)  # str() of each is passed
    stdout: Optional[Path] = None
    action: Optional[Callable[[], None]] = None
    describe: str = ""
    prepare: Optional[Callable[["Step"], Optional[str]]] = None


def run_nmt(args: list[Any], stdout: Optional[Path] = None) -> None:
    """Run `nmt ARGS` with this interpreter; stdout goes to `stdout` atomically when given.

    The hypothesis or score file appears only when the command succeeded, so a later run
    never mistakes a half-written file for a result.
    """
    argv = [sys.executable, "-m", "nmt_cli", *map(str, args)]
    if stdout is None:
        rc = subprocess.call(argv)
    else:
        stdout.parent.mkdir(parents=True, exist_ok=True)
        tmp = stdout.with_name(f".{stdout.name}.part")
        with open(tmp, "wb") as out:
            rc = subprocess.call(argv, stdout=out)
        if rc == 0:
            os.replace(tmp, stdout)
        else:
            tmp.unlink(missing_ok=True)
    if rc != 0:
        raise RecipeError(f"`nmt {args[0]}` failed (exit status {rc}); see its message above, fix it and re-run "
                          f"the recipe: finished steps are skipped")


def run_steps(steps: list[Step], dry_run: bool) -> None:
    """Show every step; unless `dry_run`, run each one right after showing it."""
    for i, step in enumerate(steps, 1):
        skip = None if dry_run or step.prepare is None else step.prepare(step)
        print(f"\n[{i}/{len(steps)}] {step.title}", flush=True)
        if step.describe:
            print(f"    {step.describe}", flush=True)
        if step.args:
            print(f"$ {command_line(step.args, step.stdout)}", flush=True)
        if skip:
            print(f"    skipped: {skip}", flush=True)
            continue
        if dry_run:
            continue
        if step.action is not None:
            step.action()
        if step.args:
            run_nmt(step.args, step.stdout)


# ---------------------------------------------------------------------------------------
# Downloads
# ---------------------------------------------------------------------------------------


def download(url: str, dest: Path, timeout: float, hint: str) -> None:
    """Fetch `url` into `dest` through `dest.part`, resuming a partial download if the server can.

    Any network failure is a RecipeError naming the URL and ending with `hint` (what to do
    offline). Progress goes to stderr every 10%.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "nmt-recipe"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if have and response.status != 206:  # no resume support: start again
                have = 0
            total = response.length + have if response.length is not None else None
            done, next_report = have, 0.1
            with open(part, "ab" if have else "wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    if total and done / total >= next_report:
                        print(f"    {dest.name}: {done / 2**20:,.0f} of {total / 2**20:,.0f} MiB", file=sys.stderr, flush=True)
                        next_report += 0.1
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise RecipeError(f"download failed: {url} ({reason}); {hint}") from None
    os.replace(part, dest)


# ---------------------------------------------------------------------------------------
# The training log and the final summary
# ---------------------------------------------------------------------------------------


def training_stats(train_jsonl: Path) -> dict[str, Any]:
    """Updates, epochs, training time and target tokens/s of a run, from logs/train.jsonl.

    After a resume the log may repeat updates (those done after the checkpoint that was
    resumed from); the last record of each (kind, update) wins. Throughput is the mean
    target tokens per update over the mean seconds per update of the logged intervals
    (train records carry `wpb` and `ups`), i.e. training proper, without validation.
    """
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    from nmt.train.plot import read_train_log  # one reader of logs/train.jsonl, tolerant of a cut line

    for r in (read_train_log(train_jsonl) if train_jsonl.is_file() else []):
        if r.get("kind") in ("train", "valid") and isinstance(r.get("update"), int):
            latest[(r["kind"], r["update"])] = r
    records = sorted(latest.values(), key=lambda r: r["update"])
    train = [r for r in records if r["kind"] == "train" and r.get("ups") and r.get("wpb")]
    valid = [r for r in records if r["kind"] == "valid"]
    tokens_per_s = sum(r["wpb"] for r in train) / sum(1.0 / r["ups"] for r in train) if train else None
    return {
        "updates": max((r["update"] for r in records), default=0),
        "epochs": max((r.get("epoch", 0) for r in records), default=0),
        "train_time_s": round(max((r.get("wall", 0.0) for r in records), default=0.0), 1),
        "target_tokens_per_s": round(tokens_per_s, 1) if tokens_per_s is not None else None,
        "last_valid_loss": valid[-1].get("loss") if valid else None,
    }


def format_duration(seconds: float) -> str:
    """90 -> '1.5 min', 7200 -> '2.0 h'."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min"


def write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically (the project's own atomic writer)."""
    from nmt.run.atomic import write_json as atomic_write_json

    atomic_write_json(path, obj)


def main_guard(prog: str, main: Callable[[], None]) -> None:
    """Run a recipe's `main`; a RecipeError is one line on stderr and exit status 1."""
    start = time.monotonic()
    try:
        main()
    except RecipeError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except BrokenPipeError:  # `... DRY_RUN=1 | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted after {format_duration(time.monotonic() - start)}; re-run to resume", file=sys.stderr)
        sys.exit(130)


def fit_average(s: dict[str, Any], run: Path, kind: str) -> Callable[[Step], Optional[str]]:
    """A `prepare` for the averaging step: fewer checkpoints than AVERAGE_LAST is said on stderr
    and kept in s["AVERAGING_NOTE"] for summary.json, never silent; none at all is an error."""
    def prepare(step: Step) -> Optional[str]:
        from nmt.average import list_checkpoints
        from nmt.errors import NmtError

        try:
            available = len(list_checkpoints(run / "checkpoints", kind))
        except NmtError:
            available = 0
        if available == 0:
            raise RecipeError(f"no checkpoints of kind {kind} in {run / 'checkpoints'} to average; did training run?")
        if available < s["AVERAGE_LAST"]:
            step.args[step.args.index("--last") + 1] = str(available)
            note = (f"warning: only {available} checkpoint(s) of kind {kind} exist, not the {s['AVERAGE_LAST']} "
                    f"asked for: averaging those (recorded in summary.json)")
            print(note, file=sys.stderr, flush=True)
            s["AVERAGING_NOTE"] = note
        return None
    return prepare


def averaged_from(path: Path) -> tuple[list[str], list[Optional[int]]]:
    """The files averaged into the checkpoint at `path`, and the update each was saved at."""
    from nmt.run.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    return list(ckpt.get("averaged_from", [])), list(ckpt.get("averaged_updates", []))
