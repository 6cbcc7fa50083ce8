"""Validation BLEU during training (`nmt train --eval-bleu`), with the paper's beam search
(`nmt translate`'s defaults: beam 4, alpha 0.6, --beam-style t2t).

Hypotheses and references are both detokenized from ids with the run's target vocabulary, so
the score equals what `nmt translate` + `nmt score` would give on the (normalized) valid set.
Rank 0 searches; the score is broadcast so every rank agrees on checkpoint_best.pt.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nmt.data.batching import padded_sources
from nmt.data.tokenizer import load_tokenizer


def validation_bleu(model: Any, corpus: Any, prep: dict[str, Any], rd: Any, device: torch.device, ctx: Any,
                    max_tokens: int = 4096) -> float:
    """sacreBLEU (13a, cased) of beam 4 / alpha 0.6 translations of the valid split."""
    bleu = torch.zeros(1, dtype=torch.float64)
    if ctx.is_main:
        import sacrebleu

        from nmt.inference.beam_search import beam_search
        from nmt.inference.config import SearchConfig

        tok = load_tokenizer(rd.root / prep["vocab"][prep["target_lang"]])
        order = sorted(corpus.indices.tolist(), key=lambda i: -int(corpus.src.sizes[i]))
        hyps: dict[int, list[int]] = {}
        was_training = model.training
        model.eval()
        search = SearchConfig()
        start = 0
        while start < len(order):
            width = int(corpus.src.sizes[order[start]]) + 1
            n = max(1, max_tokens // width)
            chunk = order[start : start + n]
            src = torch.from_numpy(padded_sources(corpus.src, np.asarray(chunk, dtype=np.int64), specials=model.cfg.special_ids)[0])
            for i, found in zip(chunk, beam_search(model, src.to(device), search)):
                hyps[i] = found[0].tokens if found else []
            start += n
        model.train(was_training)
        indices = sorted(hyps)
        hyp_text = tok.decode([hyps[i] for i in indices])
        ref_text = tok.decode([corpus.tgt[i].tolist() for i in indices])
        bleu[0] = sacrebleu.corpus_bleu(hyp_text, [ref_text]).score
    return float(ctx.broadcast_from_main(bleu)[0])
