"""Checkpoint averaging (Vaswani et al. 2017, Section 6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints,
which were written at 10-minute intervals. For the big models, we averaged the last 20."

Averaging is an element-wise mean of the parameters of checkpoints of one model. It is done
one checkpoint at a time, keeping only a running sum (accumulated in fp32 or wider, whatever
the stored dtype), so averaging 20 big checkpoints needs the memory of about two.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from nmt.run.atomic import check_file_target, remove_leftover_temps
from nmt.run.checkpoint import CHECKPOINT_VERSION, load_checkpoint, save_checkpoint
from nmt.run.checkpoint_files import EPOCH_RE, INTERVAL_RE
from nmt.errors import NmtError
from nmt.model.config import architecture
from nmt.run.identity import IDENTITY_KEY, check_identity, checkpoint_identity, identity_difference, run_identity
from nmt.run.replace import check_replaceable
from nmt.run.directory import RunDir
from nmt.run.lock import RunLock, command_line

KINDS = ("all", "updates", "epochs")
TRAINING_NAMES = ("checkpoint_last.pt", "checkpoint_best.pt")
"""Besides the numbered checkpoints, the files `nmt train` writes and resumes from."""



@dataclass(frozen=True)
class CheckpointInfo:
    """One averaging candidate and where it stands in training."""

    path: Path
    update: Optional[int]
    """From the checkpoint's train_state, else from a checkpoint_{epoch}_{update}.pt name."""
    name_epoch: int
    """The epoch in the file name (a fallback order when the update is unknown)."""


def _stored_update(path: Path) -> Optional[int]:
    """The update count saved in `path`'s train_state, read without loading the tensors."""
    try:
        # mmap: tensors stay on disk, so ordering 20 checkpoints costs no memory.
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        update = ckpt.get("train_state", {}).get("update")
        return int(update) if update is not None else None
    except Exception:  # a damaged file is reported by load_checkpoint when it is averaged
        return None


def list_checkpoints(checkpoint_dir: str | os.PathLike, kind: str = "all") -> list[CheckpointInfo]:
    """The epoch and/or update checkpoints of a run, oldest first, one per update.

    checkpoint_best/last/avg are never candidates: they duplicate numbered ones (or are the
    output). An epoch end can be saved twice (checkpoint3.pt and checkpoint_3_900.pt hold the
    same weights); such files of one update count once, else the average would weight it twice.
    """
    if kind not in KINDS:
        raise NmtError(f"unknown --kind {kind!r}; choose one of: {', '.join(KINDS)}")
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise NmtError(f"no checkpoint directory {checkpoint_dir}; train first with `nmt train`, or pass --run-dir")
    found: list[CheckpointInfo] = []
    for path in sorted(checkpoint_dir.iterdir()):
        epoch_match, update_match = EPOCH_RE.match(path.name), INTERVAL_RE.match(path.name)
        if epoch_match and kind in ("all", "epochs"):
            update = _stored_update(path)
            found.append(CheckpointInfo(path, update, int(epoch_match.group(1))))
        elif update_match and kind in ("all", "updates"):
            update = _stored_update(path)
            if update is None:
                update = int(update_match.group(2))
            found.append(CheckpointInfo(path, update, int(update_match.group(1))))
    if all(c.update is not None for c in found):
        found.sort(key=lambda c: (c.update, c.path.name))
    else:
        # Without stored updates, an epoch-end checkpoint comes after every update of its epoch.
        found.sort(key=lambda c: (c.name_epoch, c.update if c.update is not None else math.inf, c.path.name))
    unique: list[CheckpointInfo] = []
    seen_updates: set[int] = set()
    seen_files: set[tuple[int, int]] = set()
    for c in found:
        st = c.path.stat()
        if (st.st_dev, st.st_ino) in seen_files:  # one file under two names (hard links)
            continue
        seen_files.add((st.st_dev, st.st_ino))
        if c.update is not None:
            if c.update in seen_updates:
                continue
            seen_updates.add(c.update)
        unique.append(c)
    return unique


def last_checkpoint_infos(checkpoint_dir: str | os.PathLike, n: int, kind: str = "all") -> list[CheckpointInfo]:
    """The `n` most recent checkpoints by update, whatever their kind unless `kind` says."""
    if n < 1:
        raise NmtError(f"--last must be at least 1, got {n}")
    candidates = list_checkpoints(checkpoint_dir, kind)
    if len(candidates) < n:
        which = {"all": "epoch or update", "updates": "update (checkpoint_E_U.pt)", "epochs": "epoch (checkpointE.pt)"}[kind]
        raise NmtError(
            f"--last {n} asks for {n} checkpoints but {checkpoint_dir} has only {len(candidates)} "
            f"{which} checkpoint(s); pass a smaller --last or train longer"
        )
    return candidates[-n:]


def distinct_files(paths: Sequence[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """`paths` with each file once, and (name, earlier name) for each name of a file listed before.

    One file can have two names: checkpoint_last.pt is a hard link to the newest numbered
    checkpoint (`nmt.run.checkpoint_files`), so `--inputs checkpoint_3_900.pt checkpoint_last.pt`
    would weight one model twice. Files are told apart by (device, inode), not by name.
    """
    kept: list[Path] = []
    again: list[tuple[Path, Path]] = []
    seen: dict[tuple[int, int], Path] = {}
    for path in paths:
        try:
            st = path.stat()
        except OSError:  # missing: load_checkpoint says so when it gets there
            kept.append(path)
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            again.append((path, seen[key]))
        else:
            seen[key] = path
            kept.append(path)
    return kept, again


def span_warning(updates: Sequence[Optional[int]], max_share: float) -> Optional[str]:
    """A warning when the averaged checkpoints (their `updates`) span more than `max_share` of training.

    The paper averages a window of recent training (the last 5 or 20 ten-minute checkpoints of
    a 12-hour or 3.5-day run: under 10% of it). A window that reaches far back mixes an early
    model with the final one, which costs BLEU without any other sign.
    """
    n = len(updates)
    updates = [u for u in updates if u is not None]
    if len(updates) < 2 or max(updates) <= 0:
        return None
    share = (max(updates) - min(updates)) / max(updates)
    if share <= max_share:
        return None
    return (f"warning: the {n} checkpoints averaged span updates {min(updates)}-{max(updates)}, "
            f"{share:.0%} of training (more than {max_share:.0%}): an early model is mixed with the final one; "
            f"save checkpoints more often (--save-interval-minutes/--save-interval-updates) or average fewer")


def _check_same_model(first: Path, config: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                      path: Path, ckpt: dict[str, Any]) -> None:
    """Refuse to average different models: a mean of unrelated weights is silently garbage."""
    a, b = architecture(config), architecture(ckpt["config"])
    diff = [f"{k} {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if diff:
        raise NmtError(f"cannot average {first} and {path}: different architectures ({', '.join(diff)})")
    other = ckpt["model"]
    if set(shapes) != set(other):
        only = sorted(set(shapes) ^ set(other))
        more = " ..." if len(only) > 3 else ""
        raise NmtError(f"cannot average {first} and {path}: different parameters ({', '.join(only[:3])}{more})")
    for name, shape in shapes.items():
        if tuple(other[name].shape) != shape:
            raise NmtError(
                f"cannot average {first} and {path}: parameter {name} has shape {shape} vs {tuple(other[name].shape)}"
            )


def _tied_names(model: dict[str, torch.Tensor]) -> list[list[str]]:
    """Groups of state names that are one tensor (shared embeddings): torch.save keeps them
    one storage, and the average should too, or its file holds each tied matrix twice."""
    groups: dict[tuple, list[str]] = {}
    for name, t in model.items():
        groups.setdefault((t.data_ptr(), t.dtype, tuple(t.shape), t.stride()), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _is_average(path: Path) -> bool:
    """Whether `path` is a checkpoint that averaging wrote (only those name what they average)."""
    try:
        return "averaged_from" in load_checkpoint(path, mmap=True)
    except NmtError:
        return False


def check_output(output: Path) -> None:
    """Refuse an output that is a folder, a file that training owns in a checkpoints folder
    (the next `nmt train` would resume from the average, or overwrite it), or an existing file
    that is not an earlier average (`nmt.run.replace`: nmt replaces only what it wrote)."""
    check_file_target(output, "-o", "checkpoint_avg.pt")
    owned = output.name in TRAINING_NAMES or EPOCH_RE.match(output.name) or INTERVAL_RE.match(output.name)
    if owned and output.absolute().parent.name == "checkpoints":
        raise NmtError(f"-o {output} is a file that `nmt train` writes and resumes from; "
                       f"write the average elsewhere, e.g. {output.parent / 'checkpoint_avg.pt'}")
    check_replaceable(output, "-o", "an earlier average (a checkpoint that `nmt average-checkpoints` wrote)", _is_average)


def owning_run_dir(output: Path, rd: RunDir) -> Optional[RunDir]:
    """The run directory an output file lands in: `rd` when inside it, else the run of a
    RUN/checkpoints/ folder; None for a file outside any run directory."""
    out = output.absolute()
    if out.is_relative_to(rd.root.absolute()):
        return rd
    if out.parent.name == "checkpoints":
        return RunDir(out.parent.parent)
    return None


def average_into(rd: RunDir, paths: Sequence[Path], output: Path, warn: Callable[[str], None]) -> dict[str, Any]:
    """`nmt average-checkpoints`: check the output, hold the run directory it lands in (one
    writer at a time), check the inputs' vocabulary against that run's, then average."""
    check_output(output)
    run = owning_run_dir(output, rd)
    if run is None:
        return average_checkpoints(paths, output, warn=warn)
    with RunLock(run.root, command_line()):
        left = remove_leftover_temps(output.parent)
        if left:
            warn(f"removed {len(left)} temporary file(s) left by an interrupted write: {', '.join(map(str, left))}")
        expected = run_identity(run) if run.has_record("preprocess") else None
        return average_checkpoints(paths, output, expected=expected, warn=warn)


def _once(warn: Callable[[str], None]) -> Callable[[str], None]:
    said: list[str] = []

    def first_only(message: str) -> None:
        if not said:
            said.append(message)
            warn(message)

    return first_only


def _check_same_vocabulary(first: Path, first_identity: Optional[dict[str, Any]], path: Path,
                           identity: Optional[dict[str, Any]], warn: Callable[[str], None]) -> None:
    """Refuse to average models of different vocabularies: token ids would mean other pieces."""
    if first_identity is None or identity is None:
        return  # nothing recorded: the parameter shapes were compared already
    difference = identity_difference(first_identity, identity)
    if difference is not None:
        raise NmtError(f"cannot average {first} and {path}: trained with different vocabularies ({difference})")
    if ("vocab_sha256" in first_identity) != ("vocab_sha256" in identity):
        warn(f"{first if 'vocab_sha256' not in first_identity else path} predates vocabulary identities: "
             f"only vocabulary sizes could be compared")


def average_checkpoints(paths: Sequence[str | os.PathLike], output: str | os.PathLike,
                        expected: Optional[dict[str, Any]] = None,
                        warn: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Write the element-wise mean of the models in `paths` to `output`, atomically.

    The result carries the first checkpoint's model configuration, the averaged file names
    in "averaged_from", and no optimizer or training state (it is for translation, not for
    resuming). Floating-point parameters are summed in fp32 (fp64 if stored in fp64) and cast
    back to their stored dtype; other tensors are taken from the first checkpoint.
    All checkpoints must come from one vocabulary (`nmt.run.identity`), and from the run's
    (`expected`) when one is given; the result carries that identity. Returns the written
    checkpoint dict.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise NmtError("nothing to average; pass --last N or --inputs A.pt B.pt ...")
    again = distinct_files(paths)[1]
    if again:
        raise NmtError(f"{again[0][0]} and {again[0][1]} are one file, listed twice; list each checkpoint once")
    output = Path(output)

    first = paths[0]
    first_ckpt = load_checkpoint(first)
    dtypes = {name: t.dtype for name, t in first_ckpt["model"].items()}
    ties = _tied_names(first_ckpt["model"])
    total: dict[str, torch.Tensor] = {}
    for name, t in first_ckpt["model"].items():
        if t.is_floating_point():
            total[name] = t.detach().to(torch.promote_types(t.dtype, torch.float32)).clone()
        else:
            total[name] = t.detach().clone()
    # Keep only what checking the others needs; the tensors themselves are in `total` now.
    config = first_ckpt["config"]
    shapes = {name: tuple(t.shape) for name, t in first_ckpt["model"].items()}
    identity = checkpoint_identity(first_ckpt)
    warn = _once(warn)  # one warning for 20 old checkpoints, not 20
    if expected is not None:
        check_identity(identity, expected, f"checkpoint {first}", warn)
    del first_ckpt

    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        _check_same_model(first, config, shapes, path, ckpt)
        _check_same_vocabulary(first, identity, path, checkpoint_identity(ckpt), warn)
        if expected is not None:
            check_identity(checkpoint_identity(ckpt), expected, f"checkpoint {path}", warn)
        for name, t in ckpt["model"].items():
            if total[name].is_floating_point():
                total[name].add_(t.to(total[name].dtype))
        del ckpt

    n = len(paths)
    averaged = {}
    for name, t in total.items():
        averaged[name] = t.div_(n).to(dtypes[name]) if t.is_floating_point() else t
    for names in ties:  # stored once, as training stores a shared embedding
        if all(torch.equal(averaged[names[0]], averaged[other]) for other in names[1:]):
            for other in names[1:]:
                averaged[other] = averaged[names[0]]

    out_dir = output.resolve().parent
    averaged_from = [p.name if p.resolve().parent == out_dir else str(p.resolve()) for p in paths]
    checkpoint = {
        "version": CHECKPOINT_VERSION,
        "model": averaged,
        "config": config,
        "averaged_from": averaged_from,
        "averaged_updates": [_stored_update(p) for p in paths],
    }
    if identity is not None and "vocab_sha256" in identity:
        checkpoint[IDENTITY_KEY] = identity
    save_checkpoint(output, checkpoint)
    return checkpoint
