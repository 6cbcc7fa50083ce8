"""Which of a line's n-best hypotheses becomes the student's target.

chrf: the hypothesis with the highest sentence chrF against the line's reference (what
Mozilla's Firefox Translations pipeline keeps from its teacher's n-best list for parallel data):
of the teacher's good translations, the one closest to the human one. best: the teacher's own
top hypothesis (Kim and Rush's sequence-level distillation; the only choice without a reference).
"""

from __future__ import annotations

from typing import Optional, Sequence

SELECTIONS = ("chrf", "best")


def select(nbest: Sequence[tuple[str, float]], reference: Optional[str], how: str) -> str:
    """The chosen hypothesis of `nbest` ((text, score) pairs, best first); "" when it is empty.
    A tie in chrF keeps the one the model scored higher (the earlier)."""
    if not nbest:
        return ""
    if how == "best" or reference is None or len(nbest) == 1:
        return nbest[0][0]
    from sacrebleu.metrics import CHRF

    chrf = CHRF()  # sacreBLEU's chrF2 defaults, as `nmt score` reports it
    scores = [chrf.sentence_score(hyp, [reference]).score for hyp, _ in nbest]
    return nbest[max(range(len(nbest)), key=lambda i: (scores[i], -i))][0]
