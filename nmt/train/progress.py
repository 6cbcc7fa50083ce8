"""The progress of a whole training run: how far it is from its end, and what it costs.

A run ends at `--max-update`, `--max-time` (the training clock, summed over resumes) or
`--max-epoch`, whichever comes first; the estimate to each end comes from the rate of this
launch on the training clock (validation and saving included, so the estimate includes
them too). On a terminal `RunProgress` draws one bar for the whole run, never one per
epoch; log lines are written above it and stay on the screen.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

# Architectures whose update takes seconds on a CPU; a first run there gets one line of advice.
SLOW_ON_CPU = ("base", "big")
CPU_SETTINGS = "--arch mini --max-tokens 2048 --lr 2e-3 --warmup 400 --max-time 30m"


@dataclass(frozen=True)
class Limits:
    """The run's ends as given (0: no such limit)."""

    max_update: int = 0
    max_time: float = 0.0
    max_epoch: int = 0


@dataclass(frozen=True)
class Estimate:
    """Seconds of training left and the limit that ends the run first."""

    seconds: float
    limit: str


def format_duration(seconds: float) -> str:
    """2h05m, 4m10s, 37s: short enough for a progress line."""
    seconds = max(0, int(round(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def time_to_end(limits: Limits, update: int, train_time: float, updates_per_second: float,
                updates_left_in_epochs: Optional[int] = None) -> Optional[Estimate]:
    """The estimate to the nearest end of the run, or None when no limit can be estimated.

    `updates_per_second` is measured on the training clock; `updates_left_in_epochs` is the
    number of updates up to the end of epoch `--max-epoch` when that is known.
    """
    candidates = []
    if limits.max_time:
        candidates.append(Estimate(max(limits.max_time - train_time, 0.0), "max_time"))
    if updates_per_second > 0:
        if limits.max_update:
            candidates.append(Estimate(max(limits.max_update - update, 0) / updates_per_second, "max_update"))
        if limits.max_epoch and updates_left_in_epochs is not None:
            candidates.append(Estimate(max(updates_left_in_epochs, 0) / updates_per_second, "max_epoch"))
    return min(candidates, key=lambda e: e.seconds) if candidates else None


def fraction_done(limits: Limits, update: int, train_time: float, epoch_fraction: Optional[float] = None) -> Optional[float]:
    """How far the run is towards its nearest end, in [0, 1]; None without any limit."""
    parts = []
    if limits.max_update:
        parts.append(update / limits.max_update)
    if limits.max_time:
        parts.append(train_time / limits.max_time)
    if limits.max_epoch and epoch_fraction is not None:
        parts.append(epoch_fraction)
    return min(max(parts), 1.0) if parts else None


def memory_in_use(device: torch.device) -> int:
    """Bytes: the process's resident memory on a CPU, the peak of allocated memory on a GPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import psutil

    return int(psutil.Process().memory_info().rss)


def cpu_speed_hint(model: str, seconds_per_update: float, measured: int, updates_left: int, advise: bool) -> str:
    """One line for a user who trains a paper-sized `model` on a CPU: an update's time over
    `measured` updates after the launch's first (which pays for warm-up, so extrapolating it
    overestimated a run several times), what the updates left to --max-update would take, and,
    where `advise` (a fresh run, which may still choose its model), the settings that fit a CPU."""
    line = (f"note: one update of {model} takes {seconds_per_update:.1f} s on this CPU "
            f"(timed over {measured} update{'s' if measured > 1 else ''} after the first)")
    if updates_left:
        line += (f"; the {updates_left} updates left to --max-update would take "
                 f"{format_duration(seconds_per_update * updates_left)}")
    if advise:
        line += f". For a first model on a CPU use {CPU_SETTINGS} (README: 'A first model on a CPU')"
    return line


def end_of_training(trained: float, total: float, max_time: float) -> str:
    """The training clock at the end of a launch, in full: training stops at the first update
    that reaches --max-time, and the final validation and save then run past it (their cost is
    unknown until they run), so the line says by how much."""
    line = (f"training stopped at {format_duration(trained)} on the training clock, the final validation and save "
            f"took {format_duration(total - trained)} ({format_duration(total)} in all")
    if max_time and total - max_time >= 0.5:  # as format_duration rounds
        line += f", {format_duration(total - max_time)} past --max-time {format_duration(max_time)}"
    return line + ")"


class RunProgress:
    """One tqdm bar for the whole run, drawn only on a terminal.

    The bar fills towards the nearest end (updates, training time or epochs); its text gives
    updates done out of --max-update, training time out of --max-time, the estimate to the end,
    loss, lr, tokens per second and memory. tqdm's own rate and ETA are left out: they would
    count this launch's bar ticks, not the run.
    """

    RESOLUTION = 1000

    def __init__(self, limits: Limits, update: int, train_time: float, device: torch.device):
        from tqdm import tqdm

        self.limits, self.device = limits, device
        self.start_update, self.start_time = update, train_time
        self.epoch_updates: Optional[tuple[int, int, int]] = None
        self.bar = tqdm(total=self.RESOLUTION, file=sys.stderr, dynamic_ncols=True, leave=True,
                        bar_format="train {percentage:3.0f}%|{bar:20}| {desc}")
        self._last_draw = 0.0
        self._last: tuple[Optional[float], Optional[float], Optional[float]] = (None, None, None)

    def epoch(self, epoch: int, n_updates: int, done: int, update: int) -> None:
        """The current epoch's length and position (`done` of its updates at run update
        `update`), for the estimate to --max-epoch."""
        self.epoch_updates = (epoch, n_updates, update - done)

    def _epoch_position(self, update: int) -> tuple[Optional[int], Optional[float]]:
        """(updates left up to the end of --max-epoch, fraction of the epochs done), as far as known."""
        if not self.limits.max_epoch or self.epoch_updates is None:
            return None, None
        epoch, n_updates, first_update = self.epoch_updates
        done = min(update - first_update, n_updates)
        left = (self.limits.max_epoch - epoch) * n_updates + (n_updates - done)
        return left, ((epoch - 1) + done / max(n_updates, 1)) / self.limits.max_epoch

    def show(self, update: int, train_time: float, loss: Optional[float] = None, lr: Optional[float] = None,
             tokens_per_second: Optional[float] = None, force: bool = False) -> None:
        """Redraw (at most twice a second unless `force`); loss, lr and tok/s left out keep their last values."""
        self._last = (loss if loss is not None else self._last[0], lr if lr is not None else self._last[1],
                      tokens_per_second if tokens_per_second is not None else self._last[2])
        loss, lr, tokens_per_second = self._last
        now = time.monotonic()
        if not force and now - self._last_draw < 0.5:
            return
        self._last_draw = now
        updates_left, epoch_fraction = self._epoch_position(update)
        rate = (update - self.start_update) / max(train_time - self.start_time, 1e-9)
        estimate = time_to_end(self.limits, update, train_time, rate, updates_left)
        done = fraction_done(self.limits, update, train_time, epoch_fraction)
        parts = [f"upd {update}/{self.limits.max_update}" if self.limits.max_update else f"upd {update}",
                 f"time {format_duration(train_time)}"
                 + (f"/{format_duration(self.limits.max_time)}" if self.limits.max_time else "")]
        if estimate is not None:
            parts.append(f"ETA {format_duration(estimate.seconds)} to {estimate.limit}")
        if loss is not None:
            parts.append(f"loss {loss:.3f}")
        if lr is not None:
            parts.append(f"lr {lr:.2e}")
        if tokens_per_second is not None:
            parts.append(f"{tokens_per_second:.0f} tok/s")
        parts.append(f"mem {memory_in_use(self.device) / 2**20:.0f}MB")
        self.bar.set_description_str(" | ".join(parts), refresh=False)
        self.bar.n = round((done or 0.0) * self.RESOLUTION)
        self.bar.refresh()

    def write(self, line: str) -> None:
        """A log line above the bar; it stays on the screen."""
        self.bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def limits_of(cfg: Any) -> Limits:
    return Limits(int(cfg.max_update or 0), float(cfg.max_time or 0.0), int(cfg.max_epoch or 0))
