"""One resume rule (fairseq's first-launch rule) and the run directory's memory of its settings.

- When `checkpoints/checkpoint_last.pt` exists, training resumes from it, with the settings the
  run was trained with. `--restore-file`, `--finetune-from` and the `--reset-*` flags apply on
  the first launch only; what they changed (a fresh optimizer, an lr offset, a new data order)
  is in the checkpoints that follow, so a later resume continues exactly.
- A flag given on the command line that differs from the run's record is applied where that is
  safe (limits, cadences, logging, learning rate, dropout...) with one line naming the change;
  one that would make another model (architecture, vocabulary) is refused in one line that says
  what the run has and what was asked.
- With no checkpoint_last.pt but numbered checkpoints present, nothing is overwritten: training
  refuses and names the newest intact checkpoint and the flag that resumes from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from nmt.checkpoint import load_checkpoint
from nmt.checkpoints_dir import newest_intact_checkpoint
from nmt.errors import NmtError
from nmt.train_config import TrainConfig

ARCHITECTURE_FIELDS = ("arch", "d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers", "max_positions",
                       "share_all_embeddings", "share_decoder_input_output_embed", "pre_ln")
"""Model flags that would make another model: a resume refuses them."""
FIRST_LAUNCH_ONLY = ("restore_file", "finetune_from", "reset_optimizer", "reset_lr_scheduler", "reset_dataloader")
BATCHING_FIELDS = ("max_tokens", "update_freq", "seed", "required_seq_len_multiple", "required_batch_size_multiple")
"""Settings that decide an epoch's batches; with the world size they are saved in each checkpoint."""
BATCHING_DEFAULTS = {"required_seq_len_multiple": 1, "required_batch_size_multiple": 1}
"""Batching fields added after checkpoints already existed, with the value those checkpoints trained with."""


@dataclass
class Launch:
    """What this launch of `nmt train` starts from."""

    cfg: TrainConfig
    """The effective configuration: the run's record, with the safe changes asked for."""
    checkpoint: Optional[dict[str, Any]] = None
    checkpoint_path: Optional[Path] = None
    mode: str = "fresh"
    """fresh, resume (checkpoint_last.pt), restore (--restore-file) or finetune (--finetune-from)."""
    notes: list[str] = field(default_factory=list)
    """One line per change or ignored flag, printed at start and kept in config/train.json."""
    changes: dict[str, list[Any]] = field(default_factory=dict)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _describe_model(cfg: TrainConfig, model: Optional[dict[str, Any]]) -> str:
    if model:
        return (f"--arch {cfg.model.arch} (d_model {model.get('d_model')}, {model.get('encoder_layers')}+"
                f"{model.get('decoder_layers')} layers, d_ff {model.get('d_ff')}, {model.get('n_heads')} heads)")
    return f"--arch {cfg.model.arch}"


def merge_settings(recorded: TrainConfig, asked: TrainConfig, given: set[str], resuming: bool,
                   recorded_model: Optional[dict[str, Any]] = None) -> tuple[TrainConfig, list[str], dict[str, list[Any]]]:
    """The recorded settings with the explicitly `given` flags of `asked` applied where safe
    (flags by their names: the model's fields beside the others, `TrainConfig.flat`)."""
    values = recorded.flat()
    asked_values = asked.flat()
    notes: list[str] = []
    changes: dict[str, list[Any]] = {}
    for name in sorted(given):
        new, old = asked_values[name], values.get(name)
        if name in FIRST_LAUNCH_ONLY:
            if resuming and new not in (None, False):
                notes.append(f"{_flag(name)} ignored: it applies to the first launch only, and this run resumes "
                             f"from checkpoint_last.pt")
            values[name] = new if not resuming else values.get(name)
            continue
        if new == old:
            continue
        if resuming and name in ARCHITECTURE_FIELDS:
            raise NmtError(
                f"this run was trained with {_describe_model(recorded, recorded_model)}; {_flag(name)} {new} asks for "
                f"a different model: drop the flag to continue the run, or use a new --run-dir"
            )
        values[name] = new
        changes[name] = [old, new]
        if resuming:
            notes.append(f"changed {_flag(name)}: {old} -> {new} (was recorded in this run)")
    return TrainConfig.from_dict(values), notes, changes


def resolve_launch(checkpoint_dir: Path, recorded: Optional[dict[str, Any]], asked: TrainConfig, given: set[str],
                   mmap: bool = False) -> Launch:
    """Decide where this launch starts and with which settings (see the module docstring).
    With `mmap`, the checkpoint's tensors are not read (for a launcher that needs the settings only)."""

    def load(path: str | Path) -> dict[str, Any]:
        return load_checkpoint(path, mmap=mmap)

    last = checkpoint_dir / "checkpoint_last.pt"
    if last.is_file():
        try:
            ckpt = load(last)
        except NmtError as e:
            if asked.restore_file and "restore_file" in given:  # the user's answer to the hint below
                path = Path(asked.restore_file)
                cfg, notes, changes = merge_settings(TrainConfig.from_dict((recorded or {}).get("train_config") or {}), asked,
                                                     given, resuming=False)
                return Launch(cfg, load(path), path, "restore",
                              [f"{last} is damaged: restoring from {path} as asked; the next save replaces it"], changes)
            intact = newest_intact_checkpoint(checkpoint_dir, exclude=last)
            hint = (f"resume from the newest intact one with --restore-file {intact}" if intact
                    else "no other checkpoint loads; move it away to start afresh")
            raise NmtError(f"{e}; it was not replaced: {hint}") from None
        base = ckpt.get("train_config") or (recorded or {}).get("train_config") or {}
        cfg, notes, changes = merge_settings(TrainConfig.from_dict(base), asked, given, resuming=True,
                                             recorded_model=ckpt.get("config"))
        return Launch(cfg, ckpt, last, "resume", notes, changes)

    # First launch (no checkpoint_last.pt): flags apply freely.
    base_record = (recorded or {}).get("train_config")
    if base_record:  # a first launch that died before its first save: the record is the base
        cfg, _, changes = merge_settings(TrainConfig.from_dict(base_record), asked, given, resuming=False)
    else:
        cfg, changes = asked, {}
    if cfg.finetune_from:
        return Launch(cfg, load(cfg.finetune_from), Path(cfg.finetune_from), "finetune", [], changes)
    if cfg.restore_file:
        path = Path(cfg.restore_file)
        if not path.is_file():
            raise NmtError(f"--restore-file {path} does not exist")
        return Launch(cfg, load(path), path, "restore", [], changes)
    intact = newest_intact_checkpoint(checkpoint_dir) if checkpoint_dir.is_dir() else None
    if intact is not None:
        raise NmtError(
            f"{checkpoint_dir} has checkpoints but no checkpoint_last.pt, so training would start over and overwrite "
            f"them; resume from the newest intact one with --restore-file {intact}, or use a new --run-dir"
        )
    return Launch(cfg, None, None, "fresh", [], changes)


def given_from_defaults(cfg: TrainConfig) -> set[str]:
    """For Python callers that pass a TrainConfig: every flag whose value differs from its default."""
    default = TrainConfig().flat()
    return {name for name, value in cfg.flat().items() if value != default[name]}


def launch_record(launch: Launch, update: int, argv: Optional[list[str]] = None) -> dict[str, Any]:
    """One entry of config/train.json's history: what this launch started from and changed."""
    import time

    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mode": launch.mode,
        "from": str(launch.checkpoint_path) if launch.checkpoint_path else None,
        "update": update,
        "changes": launch.changes,
        "notes": launch.notes,
        "pid": os.getpid(),
        **({"argv": argv} if argv else {}),
    }
