"""Sampling one translation per sentence, for back-translation (Edunov et al. 2018,
"Understanding Back-Translation at Scale": sampled or top-k sampled source sentences train a
better reverse model than beam outputs, which are too regular).

Decoding runs step by step with the model's key/value cache, as the beam search does
(`Transformer.init_decoder_state` / `decode_step`), one row per sentence. At each step the
next token is drawn from the model's distribution, after the temperature and then either the
top-k or the top-p (nucleus, Holtzman et al. 2020) restriction; top-k 1 is therefore greedy
search. pad and bos are never drawn; at the length limit of the beam search (a * |X| + b,
within the model's positions) eos is forced. A sentence that has ended feeds pad to the
decoder until the batch ends; its rows are not dropped, so the decoder state is used only
through `decode_step`.

Draws come from one `torch.Generator` seeded by the caller: the same seed, input, batching
and device give the same translations.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.inference.beam_search import max_output_lengths, special_ids
from nmt.inference.hypothesis import Hypothesis
from nmt.model.transformer import Transformer
from nmt.inference.sampling_config import SamplingConfig
from nmt.inference.config import SearchConfig


def restrict(logits: Tensor, topk: int, topp: float) -> Tensor:
    """`logits` (R, V) with every token outside the top-k (or the top-p nucleus) set to -inf."""
    if topk:
        kth = logits.topk(min(topk, logits.size(-1)), dim=-1).values[:, -1:]
        return logits.masked_fill(logits < kth, float("-inf"))
    if topp:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # A token stays when the tokens ranked above it hold less than P: the smallest set reaching P.
        outside = probs.cumsum(dim=-1) - probs >= topp
        return logits.scatter(-1, order, sorted_logits.masked_fill(outside, float("-inf")))
    return logits


def _log_probs(models: Sequence[Transformer], states: list, tokens: Tensor) -> Tensor:
    """log P(next token) (R, V) in float32; an ensemble averages its members' log-probabilities."""
    total = None
    for model, state in zip(models, states):
        lprobs = F.log_softmax(model.decode_step(tokens, state).float(), dim=-1)
        total = lprobs if total is None else total.add_(lprobs)
    return total.div_(len(models)) if len(models) > 1 else total


@torch.inference_mode()
def sample(models: Union[Transformer, Sequence[Transformer]], src_tokens: Tensor, cfg: SamplingConfig,
           search: SearchConfig, generator: torch.Generator) -> list[list[Hypothesis]]:
    """One sampled translation per sentence of src_tokens (N, S) (right-padded, eos-terminated),
    as a one-element list so that it reads like the beam search's answer. Its score and
    log_prob are log P(Y|X) under the model itself (temperature 1, no restriction)."""
    models = [models] if isinstance(models, Transformer) else list(models)
    cfg.validate()
    n_sent, device = src_tokens.size(0), src_tokens.device
    ids = special_ids(models)
    states = [m.init_decoder_state(m.encode(src_tokens)) for m in models]
    max_len = max_output_lengths(src_tokens, search, min(m.cfg.max_positions for m in models), ids.pad)  # (N,)
    tokens = torch.full((n_sent,), ids.bos, dtype=torch.long, device=device)
    log_prob = torch.zeros(n_sent, dtype=torch.float64, device=device)
    ended = torch.zeros(n_sent, dtype=torch.bool, device=device)
    steps: list[Tensor] = []
    for step in range(int(max_len.max()) + 1):
        lprobs = _log_probs(models, states, tokens)  # (N, V)
        lprobs[:, ids.pad] = float("-inf")
        lprobs[:, ids.bos] = float("-inf")
        logits = restrict(lprobs / cfg.temperature, cfg.sampling_topk, cfg.sampling_topp)
        drawn = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]
        drawn = torch.where(max_len == step, ids.eos, drawn)
        drawn = torch.where(ended, ids.pad, drawn)
        log_prob += torch.where(ended, 0.0, lprobs.gather(1, drawn[:, None])[:, 0].double())
        steps.append(drawn)
        ended |= drawn == ids.eos
        if bool(ended.all()):
            break
        tokens = drawn
    out = torch.stack(steps, dim=1).tolist()  # (N, T)
    hyps = []
    for row, lp in zip(out, log_prob.tolist()):
        toks = row[: row.index(ids.eos)] if ids.eos in row else row
        hyps.append([Hypothesis(tokens=toks, score=lp, log_prob=lp)])
    return hyps
