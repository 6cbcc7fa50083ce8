"""What every decoding engine takes and returns for one sentence: plain records without torch,
so the CTranslate2 engine and the line handling around it run without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Hypothesis:
    """One finished translation: target token ids without eos, and its scores."""

    tokens: list[int]
    score: float
    """log P(Y|X) / lp(Y): what the search ranks by. After a forced prefix, log P counts the
    tokens that follow the prefix only, while |Y| counts the prefix too (CTranslate2's
    `target_prefix` scores the same way): every hypothesis of the line shares the prefix."""
    log_prob: float
    """log P(Y|X), eos included (after a prefix: of the tokens that follow it)."""
    attention: Optional[list[list[float]]] = None
    """When asked for: the encoder-decoder attention of each target token, eos included (rows),
    over the source tokens without eos (columns): `nmt.inference.source_attention` computes it,
    `nmt.inference.word_alignment` merges it into words."""


@dataclass(frozen=True)
class TargetRequest:
    """What one line asks of its translation's target side, in target token ids."""

    prefix: tuple[int, ...] = ()
    """The tokens the translation starts with; the search continues from them."""
    constraints: tuple[tuple[int, ...], ...] = ()
    """Phrases that must each appear in the translation, in any order (`nmt.inference.constrained_search`)."""

    def __bool__(self) -> bool:
        return bool(self.prefix or self.constraints)


NO_REQUEST = TargetRequest()
