"""The run directory: the contract between subcommands.

Every subcommand takes `--run-dir/-r` (default `$NMT_RUN_DIR`, else the current directory)
and records its effective settings there as JSON, so later steps need no repeated flags:

    config/preprocess.json   languages, vocabulary, splits, dtype, summary
    config/train.json        model configuration and training settings
    vocab/                   tokenizer model(s): joint.model, or en.model + de.model, ...
    data/                    {split}.{lang}.bin (flat token ids) + {split}.{lang}.idx (offsets)
    checkpoints/             checkpoint_last.pt, checkpoint_best.pt, checkpoint{epoch}.pt, ...
    logs/                    train.jsonl (machine-readable), train.log
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt.run import atomic
from nmt.errors import NmtError


def resolve_run_dir(run_dir: str | os.PathLike | None) -> Path:
    """The run directory a command works in: the flag, else $NMT_RUN_DIR, else the cwd."""
    if run_dir is None or str(run_dir) == "":
        run_dir = os.environ.get("NMT_RUN_DIR") or "."
    return Path(run_dir)


def check_run_dir_path(root: Path) -> Path:
    """`root` itself, after checking that it is, or can become, a directory.

    Checked before any work: a run directory named inside a regular file would otherwise
    fail only when the results are moved into place, after all the work is done.
    """
    if root.exists() and not root.is_dir():
        raise NmtError(f"--run-dir {root} is a file, not a directory; choose another --run-dir")
    for parent in root.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise NmtError(f"--run-dir {root} cannot be created: {parent} is a file, not a directory; "
                               f"choose another --run-dir")
            break
    return root


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory, and its JSON records."""

    root: Path

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def vocab_dir(self) -> Path:
        return self.root / "vocab"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def record_path(self, name: str) -> Path:
        return self.config_dir / f"{name}.json"

    def has_record(self, name: str) -> bool:
        return self.record_path(name).is_file()

    def read_record(self, name: str) -> dict[str, Any]:
        """Read `config/NAME.json`; a missing or damaged record is a user error."""
        path = self.record_path(name)
        if not path.is_file():
            hint = {
                "preprocess": "run `nmt preprocess` first",
                "train": "run `nmt train` first",
            }.get(name, f"run `nmt {name}` first")
            raise NmtError(f"{self.root} is not a run directory with {name} results ({path} is missing); {hint}, or pass --run-dir")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise NmtError(f"cannot read {path}: {e}; re-run `nmt {name}` with --force") from None

    def write_record(self, name: str, record: dict[str, Any]) -> None:
        atomic.write_json(self.record_path(name), record)
