"""The encoder-decoder attention of each line's best hypothesis, for word alignments.

After the search, the best hypotheses are run once more, teacher-forced, through the decoder
layers up to the alignment layer (`Transformer.cross_attention`): the same weights the search
computed step by step (up to float rounding), without keeping them for every hypothesis of every
step of the beam. A search that was not asked for alignments does no extra work. An ensemble
averages its members' weights, as fairseq does.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from nmt.inference.hypothesis import Hypothesis
from nmt.model.transformer import Transformer


@torch.inference_mode()
def attach_attention(models: Sequence[Transformer], src_tokens: Tensor, found: list[list[Hypothesis]], layer: int) -> None:
    """Set `attention` of each sentence's best hypothesis: (its tokens + eos) x (source tokens
    without eos) weights of decoder layer `layer`, averaged over heads (and models)."""
    rows = [i for i, hyps in enumerate(found) if hyps]
    if not rows:
        return
    best = [found[i][0] for i in rows]
    ids = models[0].cfg.special_ids
    prev = torch.full((len(rows), 1 + max(len(h.tokens) for h in best)), ids.pad, dtype=torch.long)
    for r, hyp in enumerate(best):
        prev[r, : len(hyp.tokens) + 1] = torch.tensor([ids.bos, *hyp.tokens], dtype=torch.long)
    src = src_tokens[rows]
    prev = prev.to(src.device)
    weights = sum(m.cross_attention(src, prev, layer).float() for m in models) / len(models)
    src_len = (src.ne(ids.pad).sum(1) - 1).tolist()  # eos is the last real source token
    for r, hyp in enumerate(best):
        hyp.attention = weights[r, : len(hyp.tokens) + 1, : src_len[r]].tolist()
