"""The one resume rule (fairseq's first-launch rule) and the run directory's memory of its settings.

Which launch this is depends on the checkpoints/ folder first, and only then on the flags:
- `checkpoint_last.pt` loads: training resumes from it, with the settings the run was trained
  with. `--restore-file`, `--finetune-from` and the `--reset-*` flags are ignored with a note:
  what they changed on the first launch (a fresh optimizer, an lr offset, a new data order) is
  already in the checkpoint, so a resume continues exactly.
- `checkpoint_last.pt` is damaged, or missing while numbered checkpoints exist: nothing is
  overwritten. Training refuses in one line naming the newest intact checkpoint, whatever the
  run's record says; only a `--restore-file` naming one of this run's own checkpoints, typed on
  this command line, gets through, and it continues the run from there (Adam's moments, the lr
  offset and the data position as saved; the first-launch flags are not applied again).
- Nothing saved yet: a first launch. The first-launch flags come from this command line only,
  never from config/train.json; a record whose first launch used them, and stopped before its
  first save, is refused unless they are typed again.
A flag given on the command line that differs from the run's record is applied where that is
safe (limits, cadences, logging, learning rate, dropout...) with one line naming the change;
one that would make another model (architecture, vocabulary) is refused in one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from nmt.run.checkpoint import load_checkpoint
from nmt.run.checkpoint_files import epoch_checkpoints, interval_checkpoints, newest_intact_checkpoint
from nmt.errors import NmtError
from nmt.train.config import TrainConfig

ARCHITECTURE_FIELDS = ("arch", "d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers", "max_positions",
                       "share_all_embeddings", "share_decoder_input_output_embed", "pre_ln", "activation",
                       "positions_layout", "output_bias")
"""Model flags that would make another model: a resume refuses them."""
FIRST_LAUNCH_ONLY = ("restore_file", "finetune_from", "reset_optimizer", "reset_lr_scheduler", "reset_dataloader")
"""Flags that act once, on the launch that types them; never read back from a record."""
BATCHING_FIELDS = ("max_tokens", "update_freq", "seed", "required_seq_len_multiple", "required_batch_size_multiple")
"""Settings that decide an epoch's batches; with the world size they are saved in each checkpoint."""
BATCHING_DEFAULTS = {"required_seq_len_multiple": 1, "required_batch_size_multiple": 1, "segmentations": 0}
"""Batching fields added after checkpoints already existed, with the value those checkpoints trained with."""
MODES = ("fresh", "resume", "recover", "restore", "finetune")
"""fresh; resume (checkpoint_last.pt); recover (one of the run's own checkpoints, asked for with
--restore-file when checkpoint_last.pt is damaged or missing); restore (--restore-file from
elsewhere, first launch); finetune (--finetune-from, first launch)."""
CONTINUING_MODES = ("resume", "recover")
"""Modes that continue this run: its settings, its logs up to the checkpoint, no first-launch flag."""


@dataclass
class Launch:
    """What this launch of `nmt train` starts from."""

    cfg: TrainConfig
    """The effective configuration: the run's record, with the safe changes asked for. Its
    first-launch fields are the ones this launch applies (all off when continuing the run)."""
    checkpoint: Optional[dict[str, Any]] = None
    checkpoint_path: Optional[Path] = None
    mode: str = "fresh"
    """One of MODES."""
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


def typed_first_launch_flags(asked: TrainConfig, given: set[str]) -> dict[str, Any]:
    """The first-launch flags set on this command line (a flag typed with its off value is not set)."""
    return {name: getattr(asked, name) for name in FIRST_LAUNCH_ONLY
            if name in given and getattr(asked, name) not in (None, False)}


def _with_first_launch(cfg: TrainConfig, typed: dict[str, Any]) -> TrainConfig:
    """`cfg` with its first-launch fields taken from `typed` only (the rest off)."""
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.name in FIRST_LAUNCH_ONLY}
    values = cfg.flat()
    values.update({name: typed.get(name, defaults[name]) for name in FIRST_LAUNCH_ONLY})
    return TrainConfig.from_dict(values)


def merge_settings(recorded: TrainConfig, asked: TrainConfig, given: set[str], resuming: bool,
                   recorded_model: Optional[dict[str, Any]] = None,
                   continues_from: str = "checkpoint_last.pt") -> tuple[TrainConfig, list[str], dict[str, list[Any]]]:
    """The recorded settings with the explicitly `given` flags of `asked` applied where safe
    (flags by their names: the model's fields beside the others, `TrainConfig.flat`).

    First-launch flags never come from `recorded`: on a first launch they are the typed ones;
    when `resuming` (the run continues from `continues_from`) typed ones are ignored with a note."""
    values = recorded.flat()
    asked_values = asked.flat()
    notes: list[str] = []
    changes: dict[str, list[Any]] = {}
    typed = typed_first_launch_flags(asked, given)
    for name in sorted(given):
        if name in FIRST_LAUNCH_ONLY:
            if resuming and name in typed:
                notes.append(f"{_flag(name)} ignored: it applies to the first launch only, and this run continues "
                             f"from {continues_from}")
            continue
        new, old = asked_values[name], values.get(name)
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
    return _with_first_launch(TrainConfig.from_dict(values), {} if resuming else typed), notes, changes


def _numbered_checkpoints(checkpoint_dir: Path) -> list[Path]:
    if not checkpoint_dir.is_dir():
        return []
    return interval_checkpoints(checkpoint_dir) + epoch_checkpoints(checkpoint_dir)


def _is_own(path: Path, checkpoint_dir: Path) -> bool:
    return path.resolve().parent == checkpoint_dir.resolve()


def recovery_hint(checkpoint_dir: Path) -> str:
    """What to type after checkpoint_last.pt is lost: the newest numbered checkpoint that loads."""
    last = checkpoint_dir / "checkpoint_last.pt"
    intact = newest_intact_checkpoint(checkpoint_dir, exclude=last) if checkpoint_dir.is_dir() else None
    if intact is None:
        return f"no other checkpoint loads; move {checkpoint_dir} away to start afresh, or use a new --run-dir"
    return f"continue from the newest intact one with --restore-file {intact}, or use a new --run-dir"


def _recover(checkpoint_dir: Path, recorded: Optional[dict[str, Any]], asked: TrainConfig, given: set[str],
             problem: str, load: Any) -> Launch:
    """checkpoint_last.pt is damaged or missing beside numbered checkpoints (`problem` says
    which): continue from the run's own checkpoint typed as --restore-file, or refuse."""
    typed = typed_first_launch_flags(asked, given)
    asked_path = typed.get("restore_file")
    if asked_path is None:
        raise NmtError(f"{problem}, and starting over would overwrite the run's checkpoints; {recovery_hint(checkpoint_dir)}")
    path = Path(asked_path)
    if not _is_own(path, checkpoint_dir):
        raise NmtError(f"{problem}; --restore-file {path} is not one of this run's checkpoints, and starting from it "
                       f"would overwrite them: {recovery_hint(checkpoint_dir)}")
    ckpt = load(path)
    state = ckpt.get("train_state")
    if not isinstance(state, dict) or not state.get("update"):
        raise NmtError(f"{path} holds model weights without a training position, so training would restart at update 0 "
                       f"and overwrite this run's checkpoints; {recovery_hint(checkpoint_dir)} "
                       f"(or --finetune-from {path} in a new --run-dir)")
    base = ckpt.get("train_config") or (recorded or {}).get("train_config") or {}
    cfg, notes, changes = merge_settings(TrainConfig.from_dict(base), asked, given - {"restore_file"}, resuming=True,
                                         recorded_model=ckpt.get("config"), continues_from=path.name)
    notes.insert(0, f"{problem}: continuing from {path.name} (update {state['update']}) as asked; "
                    f"the next save replaces checkpoint_last.pt")
    return Launch(cfg, ckpt, path, "recover", notes, changes)


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
            return _recover(checkpoint_dir, recorded, asked, given, f"{e}; it was not replaced", load)
        base = ckpt.get("train_config") or (recorded or {}).get("train_config") or {}
        cfg, notes, changes = merge_settings(TrainConfig.from_dict(base), asked, given, resuming=True,
                                             recorded_model=ckpt.get("config"))
        return Launch(cfg, ckpt, last, "resume", notes, changes)
    if _numbered_checkpoints(checkpoint_dir):
        return _recover(checkpoint_dir, recorded, asked, given, f"{checkpoint_dir} has checkpoints but no checkpoint_last.pt",
                        load)

    # First launch: nothing saved yet.
    typed = typed_first_launch_flags(asked, given)
    base_record = (recorded or {}).get("train_config")
    if base_record:  # a first launch that died before its first save: the record is the base
        first = {name: value for name, value in TrainConfig.from_dict(base_record).flat().items()
                 if name in FIRST_LAUNCH_ONLY and value not in (None, False)}
        starts = {"restore_file", "finetune_from"}
        if starts & first.keys() and not starts & typed.keys():
            retype = " ".join(_flag(n) if v is True else f"{_flag(n)} {v}" for n, v in first.items())
            raise NmtError(f"this run's first launch used {retype} and stopped before its first checkpoint; type them "
                           f"again to start it that way ({retype}), or use a new --run-dir to start without them")
        cfg, _, changes = merge_settings(TrainConfig.from_dict(base_record), asked, given, resuming=False)
    else:
        cfg, changes = _with_first_launch(asked, typed), {}
    if cfg.finetune_from:
        return Launch(cfg, load(cfg.finetune_from), Path(cfg.finetune_from), "finetune", [], changes)
    if cfg.restore_file:
        path = Path(cfg.restore_file)
        if not path.is_file():
            raise NmtError(f"--restore-file {path} does not exist")
        return Launch(cfg, load(path), path, "restore", [], changes)
    return Launch(cfg, None, None, "fresh", [], changes)


def log_offsets_to_keep(launch: Launch, saved_offsets: dict[str, int]) -> dict[str, int]:
    """The bytes of logs/train.jsonl and train.log this launch keeps: a launch that continues
    the run keeps them as they were at its checkpoint (`saved_offsets`, from its train_state;
    none recorded by an older checkpoint: all of them); any other start keeps nothing."""
    if launch.mode in CONTINUING_MODES:
        return dict(saved_offsets)
    return {"train.jsonl": 0, "train.log": 0}


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
