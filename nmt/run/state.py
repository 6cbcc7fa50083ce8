"""Where training stands: the plain data saved as `train_state` in every checkpoint.

Part of the run directory's contract rather than of training: reading a checkpoint
(`nmt.run.checkpoint` checks these fields' types) needs no part of training, and `nmt.run`
never imports `nmt.train`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint as plain data."""

    epoch: int = 1
    """Current epoch (1-based)."""
    updates_in_epoch: int = 0
    """Update groups of the current epoch already consumed; resuming skips their batches."""
    update: int = 0
    train_time: float = 0.0
    """The training clock: wall-clock seconds of training, validation and saving, summed over launches."""
    best_loss: Optional[float] = None
    best_bleu: Optional[float] = None
    consecutive_skips: int = 0
    lr_offset: int = 0
    """Set by --reset-lr-scheduler: the schedule restarts at update lr_offset + 1."""
    last_interval_save_time: float = 0.0
    """The training clock at the last time-interval checkpoint (the schedule of --save-interval-minutes)."""
    last_valid_update: int = -1
    patience_best: Optional[float] = None
    """The best value of --best-checkpoint-metric over all validations (--patience counts from it)."""
    stale_validations: int = 0
    """Validations in a row that did not improve on patience_best."""
    batching: dict[str, int] = field(default_factory=dict)
    """max_tokens, update_freq, seed and world size that formed this epoch's batches."""
    log_offsets: dict[str, int] = field(default_factory=dict)
    """Bytes of logs/train.jsonl and train.log at the save; a resume truncates to them."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainState":
        s = cls()
        for k, v in d.items():
            if hasattr(s, k):
                setattr(s, k, v)
        return s
