"""Training-pair cleaning with the rules of Moses' clean-corpus-n.perl.

clean-corpus-n splits each side on whitespace and drops a pair when a side has fewer than
`min` or more than `max` words, or when one side is more than `ratio` times longer than the
other. fairseq's WMT'14 En-De script (the paper's data) runs it with min 1, max 250, ratio 1.5;
Moses' own default ratio is 9. Lengths are whitespace words (after `--moses` tokenization when
that is on), not subword tokens: cleaning happens before the vocabulary exists.

Each dropped pair is counted under the first rule it breaks, so the counts add up to the number
of dropped pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # numpy is imported where it is used: every `nmt` command builds its flags from
    import numpy as np  # CleaningRules, and `nmt translate --engine ctranslate2` needs no numpy (its import costs time)

KEEP = 0
DROP_REASONS = ("empty", "too_short", "too_long", "ratio")
"""Why a pair is dropped, in the order the rules are checked; code i+1 is DROP_REASONS[i]."""


@dataclass(frozen=True)
class CleaningRules:
    """clean-corpus-n's thresholds, in whitespace words."""

    min_len: int = 1
    max_len: int = 250
    max_ratio: float = 9.0


def word_counts(lines: Sequence[str]) -> np.ndarray:
    """Whitespace words per line, as clean-corpus-n counts them."""
    import numpy as np

    return np.fromiter(map(len, map(str.split, lines)), dtype=np.int64, count=len(lines))


def drop_codes(src: Sequence[str], tgt: Sequence[str], rules: CleaningRules) -> np.ndarray:
    """Per pair: KEEP (0), or 1 + the index in DROP_REASONS of the first rule the pair breaks."""
    import numpy as np

    n_src, n_tgt = word_counts(src), word_counts(tgt)
    codes = np.full(len(n_src), KEEP, dtype=np.int8)
    shortest = np.minimum(n_src, n_tgt)
    longest = np.maximum(n_src, n_tgt)
    # Assign from the last rule to the first so the first broken rule wins.
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio_broken = longest > rules.max_ratio * shortest
    codes[ratio_broken] = 1 + DROP_REASONS.index("ratio")
    codes[longest > rules.max_len] = 1 + DROP_REASONS.index("too_long")
    codes[shortest < rules.min_len] = 1 + DROP_REASONS.index("too_short")
    codes[shortest == 0] = 1 + DROP_REASONS.index("empty")
    return codes


def count_reasons(codes: np.ndarray) -> dict[str, int]:
    """{reason: number of pairs} for the codes returned by `drop_codes`."""
    import numpy as np

    counts = np.bincount(codes.astype(np.int64), minlength=len(DROP_REASONS) + 1)
    return {reason: int(counts[i + 1]) for i, reason in enumerate(DROP_REASONS)}


def reasons_text(reasons: dict[str, int]) -> str:
    """'too long 12, ratio 3' for a {reason: count} dict; 'none' when all are zero."""
    parts = [f"{reason.replace('_', ' ')} {n}" for reason, n in reasons.items() if n]
    return ", ".join(parts) if parts else "none"
