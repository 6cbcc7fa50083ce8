"""What every decoding engine returns for one sentence: a plain record without torch, so the
CTranslate2 engine and the line handling around it run without importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Hypothesis:
    """One finished translation: target token ids without eos, and its scores."""

    tokens: list[int]
    score: float
    """log P(Y|X) / lp(Y): what the search ranks by."""
    log_prob: float
    """log P(Y|X), eos included."""
