"""The policy of training: when to validate, save and stop, as small functions of state and time.

Nothing here depends on how long an epoch or an update takes. Each cadence is its own clock:
- interval checkpoints by updates fire at multiples of `--save-interval-updates`;
- interval checkpoints by time fire when the *training* clock (wall time summed over launches,
  validation and saving included) crosses a multiple of `--save-interval-minutes`. Epoch-end
  saves never move that schedule, so "a checkpoint every 10 minutes, average the last 5" means
  the same on a CPU that runs one epoch in an hour and on a GPU that runs one in a minute. With
  `--max-time` a multiple of the interval, the last interval checkpoint is the final one;
- `--max-time` counts the same clock: training stops at the first update (or validation) that
  reaches it, and the final validation and save then run past it by their own length, which
  the run's last line reports (a checkpoint records the clock before its own save, so stopping
  earlier to leave them room would let a re-run take the budget as unfinished);
- `--patience` counts validations: the run stops when the best-checkpoint metric has not
  improved for that many validations in a row (fairseq's `should_stop_early`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Decision:
    """What to do after one update."""

    validate: bool
    interval_save: bool
    epoch_end: bool
    stop: Optional[str]

    @property
    def save(self) -> bool:
        return self.interval_save or self.epoch_end or self.stop is not None


def minute_interval_crossed(last_save_time: float, now: float, interval_minutes: float) -> bool:
    """True when the training clock passed a multiple of the interval since the last such save."""
    if interval_minutes <= 0:
        return False
    period = interval_minutes * 60.0
    return math.floor(now / period) > math.floor(last_save_time / period)


def patience_count(value: float, best: Optional[float], stale: int, higher_is_better: bool) -> tuple[float, int]:
    """(best so far, validations in a row without improvement) after a validation that measured
    `value`. Only a strict improvement resets the count, as in fairseq."""
    if best is None or (value > best if higher_is_better else value < best):
        return value, 0
    return best, stale + 1


def stop_reason(cfg: Any, update: int, epoch: int, train_time: float, interrupted: bool = False,
                stale_validations: int = 0) -> Optional[str]:
    """Why training must stop now, or None. `epoch` is the epoch about to run;
    `stale_validations` counts the last validations that did not improve the metric."""
    if interrupted:
        return "interrupted"
    if cfg.patience and stale_validations >= cfg.patience:
        return "patience"
    if cfg.max_update and update >= cfg.max_update:
        return "max_update"
    if cfg.max_time and train_time >= cfg.max_time:
        return "max_time"
    if cfg.max_epoch and epoch > cfg.max_epoch:
        return "max_epoch"
    return None


def after_update(cfg: Any, state: Any, epoch_end: bool, train_time: float, interrupted: bool = False) -> Decision:
    """The decision after update `state.update`, which may be the last of its epoch.

    As fairseq's `validate_and_save`: every save validates first (so checkpoint_best.pt can be
    chosen), and `--validate-interval-updates` validates without saving. An interruption saves
    checkpoint_last.pt only and does not validate.
    """
    next_epoch = state.epoch + 1 if epoch_end else state.epoch
    stop = stop_reason(cfg, state.update, next_epoch, train_time, interrupted)
    if stop == "interrupted":
        return Decision(validate=False, interval_save=False, epoch_end=epoch_end, stop=stop)
    interval = bool(cfg.save_interval_updates and state.update % cfg.save_interval_updates == 0)
    interval = interval or minute_interval_crossed(state.last_interval_save_time, train_time, cfg.save_interval_minutes)
    # The final checkpoint is an interval checkpoint: it closes the last window of training.
    interval = interval or stop is not None
    validate = bool(cfg.validate_interval_updates and state.update % cfg.validate_interval_updates == 0)
    validate = validate or interval or epoch_end
    return Decision(validate=validate, interval_save=interval, epoch_end=epoch_end, stop=stop)


def checkpoint_names(decision: Decision, finished_epoch: int, update: int, epoch_checkpoints: bool) -> tuple[list[str], list[str]]:
    """(names that hold the full training state, names that hold the model only) for one save.

    checkpoint_last.pt and interval checkpoints hold everything needed to resume exactly;
    epoch checkpoints hold the model (for averaging and translation) without Adam's moments,
    which are two thirds of a checkpoint's size. When an epoch ends on an interval save, the
    epoch name is one more link to the same file: no state is written twice.
    """
    full = ["checkpoint_last.pt"]
    model_only: list[str] = []
    if decision.stop == "interrupted":
        return full, model_only
    if decision.interval_save:
        full.append(f"checkpoint_{finished_epoch}_{update}.pt")
    if decision.epoch_end and epoch_checkpoints:
        (full if decision.interval_save else model_only).append(f"checkpoint{finished_epoch}.pt")
    return full, model_only
