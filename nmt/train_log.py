"""What training shows and records: a progress bar, logs/train.jsonl, logs/train.log, TensorBoard.

`logs/train.jsonl` has one object per log interval ("kind": "train") and per validation
("kind": "valid"), plus "skip" records for skipped updates. Losses are per target token in
base 2 (bits), as fairseq logs them; ppl = 2 ** nll_loss.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional

LN2 = math.log(2.0)
LOG_FILES = ("train.jsonl", "train.log")


def log_offsets(log_dir: Path) -> dict[str, int]:
    """The current length of each log file, saved in checkpoints so a resume can cut back to it."""
    return {name: (log_dir / name).stat().st_size if (log_dir / name).is_file() else 0 for name in LOG_FILES}


def truncate_logs(log_dir: Path, offsets: dict[str, int]) -> None:
    """Cut each log back to its length at the checkpoint training resumes from.

    Updates done after that checkpoint by a process that then died are done again; without
    this, train.jsonl would hold their records twice.
    """
    for name, size in offsets.items():
        path = log_dir / name
        if path.is_file() and path.stat().st_size > size:
            with open(path, "r+b") as f:
                f.truncate(size)


class TrainLogger:
    def __init__(self, log_dir: Path, log_interval: int, enabled: bool = True, progress_bar: bool = True):
        self.enabled, self.log_interval = enabled, max(1, log_interval)
        self.use_bar = progress_bar and sys.stderr.isatty()
        self.bar = None
        self.tb = None
        self._reset_interval()
        if not enabled:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(log_dir / "train.jsonl", "a", encoding="utf-8")
        self.text = open(log_dir / "train.log", "a", encoding="utf-8")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(log_dir / "tensorboard"))
        except Exception:  # tensorboard is optional
            self.tb = None

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
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def record(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps(rec) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k not in ("update", "epoch"):
                    self.tb.add_scalar(f"{rec['kind']}/{k}", v, rec["update"])

    # -- events ---------------------------------------------------------------------------
    def start(self, trainer: Any, description: str) -> None:
        self.info(description)

    def epoch_start(self, epoch: int, n_updates: int, done: int) -> None:
        self.epoch = epoch
        if self.enabled and self.use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=n_updates, initial=done, desc=f"epoch {epoch:03d}", unit="upd",
                            file=sys.stderr, dynamic_ncols=True, leave=False)
        self._reset_interval()

    def train_update(self, state: Any, out: dict[str, float]) -> None:
        a = self.acc
        for k in ("loss_sum", "nll_sum", "ntokens", "src_tokens", "nsentences"):
            a[k] += out[k]
        a["gnorm"] += out["gnorm"]
        a["n"] += 1
        if self.bar is not None:
            self.bar.update(1)
        if state.update % self.log_interval != 0:
            if self.bar is not None and a["n"] % 5 == 1:
                self._postfix(out["lr"])
            return
        elapsed = max(time.monotonic() - self.interval_start, 1e-9)
        nll = a["nll_sum"] / a["ntokens"] / LN2
        rec = {
            "kind": "train", "epoch": state.epoch, "update": state.update,
            "loss": round(a["loss_sum"] / a["ntokens"] / LN2, 4), "nll_loss": round(nll, 4),
            "ppl": round(2**nll, 3), "lr": out["lr"], "wps": round(a["ntokens"] / elapsed, 1),
            "src_wps": round(a["src_tokens"] / elapsed, 1), "ups": round(a["n"] / elapsed, 3),
            "wpb": round(a["ntokens"] / a["n"], 1), "bsz": round(a["nsentences"] / a["n"], 1),
            "gnorm": round(a["gnorm"] / a["n"], 4), "wall": round(state.train_time, 2),
        }
        self.record(rec)
        self._postfix(out["lr"], rec)
        if self.bar is None:
            self.info(" | ".join(f"{k} {v}" for k, v in rec.items() if k != "kind"))
        self._reset_interval()

    def _postfix(self, lr: float, rec: Optional[dict[str, Any]] = None) -> None:
        if self.bar is None:
            return
        a = self.acc
        if rec is None and a["ntokens"]:
            elapsed = max(time.monotonic() - self.interval_start, 1e-9)
            rec = {"loss": a["loss_sum"] / a["ntokens"] / LN2, "wps": a["ntokens"] / elapsed}
        if rec:
            self.bar.set_postfix(loss=f"{rec['loss']:.3f}", lr=f"{lr:.2e}", wps=f"{rec['wps']:.0f}", refresh=False)

    def valid(self, state: Any, metrics: dict[str, float]) -> None:
        rec = {"kind": "valid", "epoch": state.epoch, "update": state.update, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()},
               "best_loss": round(min(metrics["loss"], state.best_loss if state.best_loss is not None else math.inf), 4),
               "wall": round(state.train_time, 2)}
        self.record(rec)
        self.info("valid | " + " | ".join(f"{k} {v}" for k, v in rec.items() if k != "kind"))

    def skip(self, update: int, epoch: int, gnorm: float, scale: Optional[float]) -> None:
        rec = {"kind": "skip", "epoch": epoch, "update": update, "gnorm": gnorm if math.isfinite(gnorm) else str(gnorm)}
        if scale is not None:
            rec["loss_scale"] = scale
        self.record(rec)
        self.info(f"skipped update {update}: non-finite gradient" + (f" (fp16 loss scale now {scale})" if scale else ""))

    def saved(self, names: list[str], update: int) -> None:
        self.info(f"saving {', '.join(names)} (update {update})")

    def epoch_end(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        """Close every output; safe to call twice, and after a failed write (a full disk)."""
        self.epoch_end()
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
