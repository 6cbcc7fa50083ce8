"""What training shows and records: a progress bar, logs/train.jsonl, logs/train.log, TensorBoard.

`logs/train.jsonl` has one object per log interval ("kind": "train") and per validation
("kind": "valid"), "skip" records for skipped updates, and one "stop" record when a launch
ends (its "reason": max_update, max_time, max_epoch, patience or interrupted). Losses are per target token in
base 2 (bits), as fairseq logs them; ppl = 2 ** nll_loss. An interval's wps, src_wps and ups count
training alone (validation and saving left out), its "wall" the training clock, which has them.

A log interval ends at a multiple of --log-interval, after LOG_SECONDS of training whatever the
interval's length (slow updates on a CPU), and when training stops, so that every update trained
is in a train record. What is logged never feeds back into training: a line more or less changes
no number of the run.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from nmt.train.progress import SLOW_ON_CPU, RunProgress, cpu_speed_hint, limits_of, memory_in_use

LN2 = math.log(2.0)
LOG_FILES = ("train.jsonl", "train.log")
LOG_SECONDS = 60.0
"""A log interval ends after this many seconds of training even before --log-interval updates:
a run on a slow CPU (seconds per update) shows its progress, as Marian's --disp-freq 60s would."""
CPU_NOTE_UPDATES, CPU_NOTE_SECONDS = 10, 30.0
"""The CPU note times this many updates after the launch's first, or as many as run in this many seconds."""


def log_offsets(log_dir: Path) -> dict[str, int]:
    """The current length of each log file, saved in checkpoints so a resume can cut back to it."""
    return {name: (log_dir / name).stat().st_size if (log_dir / name).is_file() else 0 for name in LOG_FILES}


def truncate_logs(log_dir: Path, offsets: dict[str, int]) -> dict[str, bytes]:
    """Cut each log back to its length at the checkpoint training resumes from, and return
    what was cut (so that a launch that then fails before saving can put it back).

    Updates done after that checkpoint by a process that then died are done again; without
    this, train.jsonl would hold their records twice.
    """
    cut: dict[str, bytes] = {}
    for name, size in offsets.items():
        path = log_dir / name
        if path.is_file() and path.stat().st_size > size:
            with open(path, "r+b") as f:
                f.seek(size)
                cut[name] = f.read()
                f.truncate(size)
    return cut


def restore_logs(log_dir: Path, offsets: dict[str, int], cut: dict[str, bytes]) -> None:
    """Put the logs back as they were before a launch that failed without saving anything:
    cut back to `offsets`, then the tails `truncate_logs` removed at its start re-appended."""
    truncate_logs(log_dir, offsets)
    for name, tail in cut.items():
        with open(log_dir / name, "ab") as f:
            f.write(tail)


TENSORBOARD_SCALARS = {
    "train": ("loss", "nll_loss", "ppl", "lr", "gnorm", "wps"),
    "valid": ("loss", "nll_loss", "ppl", "bleu"),
}
"""What --tensorboard writes, as `{kind}/{name}` tags against the update count (wps = target tokens/s)."""


def open_tensorboard(logdir: Path, purge_step: Optional[int]) -> Any:
    """A SummaryWriter for `logdir`; events after `purge_step` (a dead launch's, redone after a
    resume) are discarded by TensorBoard."""
    from torch.utils.tensorboard import SummaryWriter  # TrainConfig.validate checked that tensorboard is installed

    return SummaryWriter(str(logdir), purge_step=purge_step)


def log_line(rec: dict[str, Any]) -> str:
    """A train record as its human log line. The lr is shown to 4 significant digits: past
    warmup it is d_model^-0.5 * step^-0.5, whose full repr runs to 19 digits; train.jsonl keeps
    the exact float."""
    return " | ".join(f"{k} {v:.4g}" if k == "lr" and isinstance(v, float) else f"{k} {v}"
                      for k, v in rec.items() if k != "kind")


class TrainLogger:
    """Writes every record to logs/train.jsonl and its line to logs/train.log, whether a
    terminal is attached or not; on a terminal the lines go above one progress bar for the
    whole run (`nmt.train.progress.RunProgress`), otherwise they are printed as they are."""

    def __init__(self, log_dir: Path, log_interval: int, enabled: bool = True, progress_bar: bool = True,
                 tensorboard_dir: Optional[Path] = None):
        self.enabled, self.log_interval = enabled, max(1, log_interval)
        self.use_bar = progress_bar and sys.stderr.isatty()
        self.bar: Optional[RunProgress] = None
        self.tb = None
        self.tensorboard_dir = tensorboard_dir
        self.device: Any = None
        self.cpu_note: Optional[tuple[str, bool]] = None
        """(the model as the note names it, whether to advise the CPU settings): set for base/big on a CPU."""
        self._note_start: Optional[tuple[float, float, int]] = None
        self._max_update = 0
        self.paused_total = 0.0
        """Seconds of this launch spent in `paused` (validation, saving)."""
        self.lines = 0
        """Train records written by this launch."""
        self._reset_interval()
        if not enabled:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(log_dir / "train.jsonl", "a", encoding="utf-8")
        self.text = open(log_dir / "train.log", "a", encoding="utf-8")

    def _reset_interval(self) -> None:
        self.acc = {"loss_sum": 0.0, "nll_sum": 0.0, "ntokens": 0.0, "src_tokens": 0.0, "nsentences": 0.0, "gnorm": 0.0,
                    "n": 0, "lr": 0.0}
        self.interval_start, self.interval_paused_from = time.monotonic(), self.paused_total

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time spent inside out of the interval's wps, src_wps and ups and out of the
        CPU note, which measure training: a validation or a save inside an interval would
        otherwise lower them by its own length, and more the more often it runs."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.paused_total += time.monotonic() - start

    def _training_seconds(self, since: float, paused_then: float) -> float:
        """Seconds spent training from `since` (when `paused_total` was `paused_then`) to now."""
        return max(time.monotonic() - since - (self.paused_total - paused_then), 1e-9)

    # -- output helpers -------------------------------------------------------------------
    def info(self, message: str) -> None:
        if not self.enabled:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.text.write(f"{stamp} | {message}\n")
        self.text.flush()
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def record(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps(rec) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k in TENSORBOARD_SCALARS.get(rec["kind"], ()):
                if isinstance(rec.get(k), (int, float)):
                    self.tb.add_scalar(f"{rec['kind']}/{k}", rec[k], rec["update"])

    # -- events ---------------------------------------------------------------------------
    def start(self, trainer: Any, description: str) -> None:
        s = trainer.state
        self.device = trainer.device
        if self.enabled and self.tensorboard_dir is not None:
            self.tb = open_tensorboard(self.tensorboard_dir, purge_step=s.update + 1 if s.update else None)
        if self.enabled and self.use_bar:
            self.bar = RunProgress(limits_of(trainer.cfg), s.update, s.train_time, trainer.device)
        # A fresh run names its model by --arch, which it may still change; a resumed or fine-tuned
        # one is the model it is (trainer.arch: base or big by its size), and no --arch is advised.
        fresh = trainer.launch.mode == "fresh"
        arch = trainer.cfg.model.arch if fresh else trainer.arch
        if trainer.device.type == "cpu" and arch in SLOW_ON_CPU:
            self.cpu_note = (f"--arch {arch}" if fresh else f"this {arch}-sized model", fresh)
            self._max_update = trainer.cfg.max_update
        self.info(description)

    def epoch_start(self, epoch: int, n_updates: int, done: int, update: int = 0) -> None:
        if self.bar is not None:
            self.bar.epoch(epoch, n_updates, done, update)
        self._reset_interval()

    def train_update(self, state: Any, out: dict[str, float], last: bool = False) -> None:
        """Count one update into the interval; `last`: training stops after it."""
        a = self.acc
        for k in ("loss_sum", "nll_sum", "ntokens", "src_tokens", "nsentences", "gnorm"):
            a[k] += out[k]
        a["n"] += 1
        a["lr"] = out["lr"]
        self._cpu_note(state.update, last)
        elapsed = self._training_seconds(self.interval_start, self.interval_paused_from)
        if last or self._interval_ends(state.update, elapsed):
            self.end_interval(state)
        elif self.bar is not None:
            self.bar.show(state.update, state.train_time, a["loss_sum"] / max(a["ntokens"], 1) / LN2, out["lr"],
                          a["ntokens"] / elapsed)

    def _interval_ends(self, update: int, elapsed: float) -> bool:
        """At a multiple of --log-interval, or after LOG_SECONDS of training; and at a launch's
        first update when the interval would, at that update's pace, last longer than that: a
        slow run then says at once that it trains, what its loss and lr are."""
        if update % self.log_interval == 0 or elapsed >= LOG_SECONDS:
            return True
        first = self.lines == 0 and self.acc["n"] == 1
        return first and elapsed * (self.log_interval - update % self.log_interval) >= LOG_SECONDS

    def end_interval(self, state: Any) -> None:
        """Write the interval's train record and line, if it has updates: when its cadence comes,
        and when training stops (the loop calls it then, for a last update that was skipped)."""
        a = self.acc
        if a["n"] == 0:
            return
        elapsed = self._training_seconds(self.interval_start, self.interval_paused_from)
        nll = a["nll_sum"] / a["ntokens"] / LN2
        rec = {
            "kind": "train", "epoch": state.epoch, "update": state.update,
            "loss": round(a["loss_sum"] / a["ntokens"] / LN2, 4), "nll_loss": round(nll, 4),
            "ppl": round(2**nll, 3), "lr": a["lr"], "wps": round(a["ntokens"] / elapsed, 1),
            "src_wps": round(a["src_tokens"] / elapsed, 1), "ups": round(a["n"] / elapsed, 3),
            "wpb": round(a["ntokens"] / a["n"], 1), "bsz": round(a["nsentences"] / a["n"], 1),
            "gnorm": round(a["gnorm"] / a["n"], 4), "wall": round(state.train_time, 2),
            "mem_mb": round(memory_in_use(self.device) / 2**20, 1) if self.enabled else 0.0,
        }
        self.record(rec)
        self.info(log_line(rec))
        if self.bar is not None:
            self.bar.show(state.update, state.train_time, rec["loss"], rec["lr"], rec["wps"], force=True)
        self.lines += 1
        self._reset_interval()

    def _cpu_note(self, update: int, last: bool) -> None:
        """Once per launch, for base/big on a CPU: how long an update takes, timed from the end of
        the launch's first update (warm-up) over CPU_NOTE_UPDATES updates or CPU_NOTE_SECONDS,
        whichever comes first (or up to the last update), and the settings that fit a CPU."""
        if self.cpu_note is None:
            return
        if self._note_start is None:
            self._note_start = (time.monotonic(), self.paused_total, update)
            return
        since, paused_then, first = self._note_start
        seconds, measured = self._training_seconds(since, paused_then), update - first
        if measured >= CPU_NOTE_UPDATES or seconds >= CPU_NOTE_SECONDS or last:
            left = max(self._max_update - update, 0) if self._max_update else 0
            model, advise = self.cpu_note
            self.info(cpu_speed_hint(model, seconds / measured, measured, left, advise))
            self.cpu_note = None

    def valid(self, state: Any, metrics: dict[str, float]) -> None:
        rec = {"kind": "valid", "epoch": state.epoch, "update": state.update, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()},
               "best_loss": round(min(metrics["loss"], state.best_loss if state.best_loss is not None else math.inf), 4),
               "wall": round(state.train_time, 2)}
        self.record(rec)
        self.info("valid | " + " | ".join(f"{k} {v}" for k, v in rec.items() if k != "kind"))

    def stop(self, state: Any, reason: str, **details: Any) -> None:
        """The last record of a launch: why training stopped (docs/training.md, "Watching training")."""
        rec = {"kind": "stop", "epoch": state.epoch, "update": state.update, "reason": reason, **details,
               "wall": round(state.train_time, 2)}
        self.record(rec)
        if self.bar is not None:
            self.bar.show(state.update, state.train_time, force=True)

    def skip(self, update: int, epoch: int, gnorm: float, scale: Optional[float]) -> None:
        rec = {"kind": "skip", "epoch": epoch, "update": update, "gnorm": gnorm if math.isfinite(gnorm) else str(gnorm)}
        if scale is not None:
            rec["loss_scale"] = scale
        self.record(rec)
        self.info(f"skipped update {update}: non-finite gradient" + (f" (fp16 loss scale now {scale})" if scale else ""))

    def saved(self, names: list[str], update: int) -> None:
        self.info(f"saving {', '.join(names)} (update {update})")

    def close(self) -> None:
        """Close every output; safe to call twice, and after a failed write (a full disk)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if not self.enabled:
            return
        self.enabled = False
        for out in (self.jsonl, self.text, self.tb):
            if out is None:
                continue
            try:
                out.close()
            except OSError:
                pass
