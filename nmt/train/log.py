"""What training shows and records: a progress bar, logs/train.jsonl, logs/train.log, TensorBoard.

`logs/train.jsonl` has one object per log interval ("kind": "train") and per validation
("kind": "valid"), "skip" records for skipped updates, and one "stop" record when a launch
ends (its "reason": max_update, max_time, max_epoch, patience or interrupted). Losses are per target token in
base 2 (bits), as fairseq logs them; ppl = 2 ** nll_loss.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional

from nmt.train.progress import SLOW_ON_CPU, RunProgress, cpu_speed_hint, limits_of, memory_in_use

LN2 = math.log(2.0)
LOG_FILES = ("train.jsonl", "train.log")


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
        self.cpu_hint_arch: Optional[str] = None
        """Set for base/big on a CPU: the launch's second update then prints how long it took."""
        self._hint_max_update = 0
        self._first_update_at: Optional[float] = None
        self._reset_interval()
        if not enabled:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(log_dir / "train.jsonl", "a", encoding="utf-8")
        self.text = open(log_dir / "train.log", "a", encoding="utf-8")

    def _reset_interval(self) -> None:
        self.acc = {"loss_sum": 0.0, "nll_sum": 0.0, "ntokens": 0.0, "src_tokens": 0.0, "nsentences": 0.0, "gnorm": 0.0, "n": 0}
        self.interval_start = time.monotonic()

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
        if trainer.device.type == "cpu" and trainer.cfg.model.arch in SLOW_ON_CPU:
            self.cpu_hint_arch, self._hint_max_update = trainer.cfg.model.arch, trainer.cfg.max_update
        self.info(description)

    def epoch_start(self, epoch: int, n_updates: int, done: int, update: int = 0) -> None:
        if self.bar is not None:
            self.bar.epoch(epoch, n_updates, done, update)
        self._reset_interval()

    def train_update(self, state: Any, out: dict[str, float]) -> None:
        a = self.acc
        for k in ("loss_sum", "nll_sum", "ntokens", "src_tokens", "nsentences"):
            a[k] += out[k]
        a["gnorm"] += out["gnorm"]
        a["n"] += 1
        self._cpu_hint()
        elapsed = max(time.monotonic() - self.interval_start, 1e-9)
        if state.update % self.log_interval != 0:
            if self.bar is not None:
                self.bar.show(state.update, state.train_time, a["loss_sum"] / max(a["ntokens"], 1) / LN2, out["lr"],
                              a["ntokens"] / elapsed)
            return
        nll = a["nll_sum"] / a["ntokens"] / LN2
        rec = {
            "kind": "train", "epoch": state.epoch, "update": state.update,
            "loss": round(a["loss_sum"] / a["ntokens"] / LN2, 4), "nll_loss": round(nll, 4),
            "ppl": round(2**nll, 3), "lr": out["lr"], "wps": round(a["ntokens"] / elapsed, 1),
            "src_wps": round(a["src_tokens"] / elapsed, 1), "ups": round(a["n"] / elapsed, 3),
            "wpb": round(a["ntokens"] / a["n"], 1), "bsz": round(a["nsentences"] / a["n"], 1),
            "gnorm": round(a["gnorm"] / a["n"], 4), "wall": round(state.train_time, 2),
            "mem_mb": round(memory_in_use(self.device) / 2**20, 1) if self.enabled else 0.0,
        }
        self.record(rec)
        self.info(log_line(rec))
        if self.bar is not None:
            self.bar.show(state.update, state.train_time, rec["loss"], out["lr"], rec["wps"], force=True)
        self._reset_interval()

    def _cpu_hint(self) -> None:
        """Once, after the second update of the launch (the first one pays for warm-up): how
        long an update of a paper-sized model takes on this CPU, and the settings that fit one."""
        if self.cpu_hint_arch is None:
            return
        now = time.monotonic()
        if self._first_update_at is None:
            self._first_update_at = now
            return
        self.info(cpu_speed_hint(self.cpu_hint_arch, now - self._first_update_at, self._hint_max_update))
        self.cpu_hint_arch = None

    def valid(self, state: Any, metrics: dict[str, float]) -> None:
        rec = {"kind": "valid", "epoch": state.epoch, "update": state.update, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()},
               "best_loss": round(min(metrics["loss"], state.best_loss if state.best_loss is not None else math.inf), 4),
               "wall": round(state.train_time, 2)}
        self.record(rec)
        self.info("valid | " + " | ".join(f"{k} {v}" for k, v in rec.items() if k != "kind"))

    def stop(self, state: Any, reason: str, **details: Any) -> None:
        """The last record of a launch: why training stopped (see README, 'Logs')."""
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
