"""Beam search with length penalty (Section 6.1 of the paper: beam 4, alpha 0.6).

The search runs over whole tensors: all sentences of a batch and all their hypotheses are
rows of one decoder batch, advanced one token per step with the model's key/value cache
(`Transformer.decode_step`); the encoder and its keys/values run once per sentence.

One step, for every sentence at once:
  1. log-probabilities of the next token for every alive hypothesis: logits and one
     log-sum-exp per row, never a written-out (rows, V) log-softmax (an ensemble averages
     its members' log-probabilities);
  2. the sentence's beam is its `width` best one-token extensions by log-probability (all
     have the same length, so the length penalty would not change their order);
  3. an extension that ends in eos leaves the beam for the finished set, scored with the
     length penalty, and takes its slot with it (the beam narrows by one, as in dl4mt and
     Nematus), so `beam 1` is exactly greedy search;
  4. a sentence stops when its width reaches 0, at its maximum length (eos is forced there),
     or -- exact early termination -- when no alive hypothesis can still beat the n-th best
     finished one: log-probabilities only fall as a hypothesis grows, so the best any
     extension of an alive hypothesis can score is its log-probability over the largest
     penalty among the lengths it may still reach.
Finished sentences leave the batch (their rows are dropped from the decoder state), so the
late steps of a batch cost only what is still being searched.

|Y| counts the end-of-sentence token in both length-penalty styles (tensor2tensor and
fairseq both do). pad and bos are never generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.errors import NmtError
from nmt.model import DecoderState, Transformer
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.translate_config import LENPEN_STYLES, SearchConfig


@dataclass(frozen=True)
class LengthPenalty:
    """lp(Y), the divisor of a hypothesis' log-probability when hypotheses are ranked.

    gnmt: ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14; tensor2tensor, the paper's code).
    avg:  |Y|^alpha (fairseq, Marian, CTranslate2); alpha 1 is the per-token average.
    """

    alpha: float = 0.6
    style: str = "gnmt"

    def __post_init__(self) -> None:
        if self.style not in LENPEN_STYLES:
            raise NmtError(f"unknown --lenpen-style {self.style!r}; choose one of {', '.join(LENPEN_STYLES)}")
        if not math.isfinite(self.alpha):
            raise NmtError(f"--lenpen must be a finite number, not {self.alpha}")

    def __call__(self, length: Union[Tensor, float]) -> Union[Tensor, float]:
        """lp for `length` tokens (eos included): a number or an elementwise tensor."""
        if isinstance(length, Tensor):
            length = length.to(torch.float32)
        if self.style == "gnmt":
            return ((5.0 + length) / 6.0) ** self.alpha
        return length**self.alpha

    def score(self, log_prob: Union[Tensor, float], length: Union[Tensor, float]) -> Union[Tensor, float]:
        """The ranking score log P(Y|X) / lp(Y)."""
        return log_prob / self(length)


@dataclass
class Hypothesis:
    """One finished translation: target token ids without eos, and its scores."""

    tokens: list[int]
    score: float
    """log P(Y|X) / lp(Y): what the search ranks by."""
    log_prob: float
    """log P(Y|X), eos included."""


def max_output_lengths(src_tokens: Tensor, cfg: SearchConfig, max_positions: int) -> Tensor:
    """Tokens each sentence may generate before eos: a * |X| + b, where |X| excludes eos,
    capped so that bos + tokens fit the decoder's `max_positions`."""
    src_len = src_tokens.ne(PAD_ID).sum(1) - 1  # (N,)
    limit = torch.floor(cfg.max_len_a * src_len.to(torch.float64) + cfg.max_len_b).to(torch.long)
    return limit.clamp(0, max_positions - 1)


def _next_scores(models: Sequence[Transformer], states: Sequence[DecoderState], tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Next-token scores (R, V) float32 and per-row normalizers (R,): log P = scores - norm.

    One model: scores are the logits and norm their log-sum-exp, so the full (R, V)
    log-softmax is never written. An ensemble averages its members' log-probabilities.
    """
    if len(models) == 1:
        logits = models[0].decode_step(tokens, states[0]).float()
        return logits, torch.logsumexp(logits, dim=-1)
    total = None
    for model, state in zip(models, states):
        lprobs = F.log_softmax(model.decode_step(tokens, state).float(), dim=-1)
        total = lprobs if total is None else total.add_(lprobs)
    total.div_(len(models))
    return total, total.new_zeros(total.size(0))


def _row_topk(scores: Tensor, w: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """scores.topk(w, dim=1), faster for a large V: the w best entries of a row lie in the w
    blocks of `block` entries with the largest maxima, so only those blocks are ranked."""
    n_rows, vocab = scores.shape
    if vocab % block or vocab < 8 * w * block:
        return scores.topk(w, dim=1)
    blocks = scores.view(n_rows, vocab // block, block)
    best_blocks = blocks.amax(2).topk(w, dim=1).indices  # (R, w)
    candidates = blocks.gather(1, best_blocks[:, :, None].expand(-1, -1, block)).view(n_rows, w * block)
    values, pos = candidates.topk(w, dim=1)
    return values, best_blocks.gather(1, pos // block) * block + pos % block


@torch.inference_mode()
def beam_search(
    models: Union[Transformer, Sequence[Transformer]],
    src_tokens: Tensor,
    cfg: SearchConfig,
    stop_early: bool = True,
) -> list[list[Hypothesis]]:
    """Translate a batch: src_tokens (N, S) right-padded with pad, eos-terminated.

    Returns, per sentence, its `cfg.nbest` best finished hypotheses, best first.
    `stop_early=False` searches every sentence to its width or length limit; results are the
    same (that is what makes the early termination exact), only slower.
    """
    models = [models] if isinstance(models, Transformer) else list(models)
    cfg.validate()
    if len({m.cfg.tgt_vocab_size for m in models}) != 1:
        raise NmtError("the ensembled checkpoints have different target vocabularies; ensemble models of one run")
    lp = LengthPenalty(cfg.lenpen, cfg.lenpen_style)
    device = src_tokens.device
    n_sent = src_tokens.size(0)
    k = cfg.beam
    vocab = models[0].cfg.tgt_vocab_size
    w = min(k, vocab)  # candidates taken from each row: a sentence's best k lie among its rows' best k
    neg_inf = float("-inf")

    states = [m.init_decoder_state(m.encode(src_tokens)) for m in models]

    # Per active sentence.
    sent_id = torch.arange(n_sent, device=device)  # index into the batch
    max_len = max_output_lengths(src_tokens, cfg, min(m.cfg.max_positions for m in models))
    width = torch.full((n_sent,), k, dtype=torch.long, device=device)  # beam slots still open
    nth_best = torch.full((n_sent, cfg.nbest), neg_inf, device=device)  # best finished scores, sorted
    # Per alive hypothesis (row of the decoder batch); one row per sentence to start (bos).
    row_sent = torch.arange(n_sent, device=device)
    row_slot = torch.zeros(n_sent, dtype=torch.long, device=device)
    row_logp = torch.zeros(n_sent, device=device)
    history = torch.empty(n_sent, 0, dtype=torch.long, device=device)  # (R, t) tokens so far
    tokens = torch.full((n_sent,), BOS_ID, dtype=torch.long, device=device)
    finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(n_sent)]
    ranks = torch.arange(k, device=device)

    step = 0
    while True:
        n_active, n_rows = sent_id.numel(), tokens.numel()
        scores, norm = _next_scores(models, states, tokens)  # (R, V), (R,)
        scores[:, PAD_ID] = neg_inf  # never generated; they still count in the normalizer
        scores[:, BOS_ID] = neg_inf

        # The best k extensions of each sentence, from its rows' best w.
        row_vals, row_tok = _row_topk(scores, w)  # (R, w)
        row_vals -= norm[:, None]
        at_limit = max_len[row_sent] == step  # (R,) only eos may follow
        if bool(at_limit.any()):
            eos = scores[at_limit, EOS_ID] - norm[at_limit]
            row_vals[at_limit] = neg_inf
            row_vals[at_limit, 0] = eos
            row_tok[at_limit, 0] = EOS_ID
        row_vals += row_logp[:, None]
        grid = torch.full((n_active, k, w), neg_inf, device=device)
        grid[row_sent, row_slot] = row_vals
        row_of = torch.zeros((n_active, k), dtype=torch.long, device=device)
        row_of[row_sent, row_slot] = torch.arange(n_rows, device=device)
        cand_logp, cand_pos = grid.view(n_active, k * w).topk(k, dim=1)  # (n_active, k), sorted
        parent = row_of.gather(1, cand_pos // w)  # (n_active, k) row each candidate extends
        cand_tok = row_tok[parent, cand_pos % w]
        in_beam = (ranks[None, :] < width[:, None]) & (cand_logp > neg_inf)
        is_eos = cand_tok == EOS_ID
        ends, grows = in_beam & is_eos, in_beam & ~is_eos

        if bool(ends.any()):
            length = step + 1  # |Y|: tokens so far plus eos
            end_scores = torch.where(ends, lp.score(cand_logp, float(length)), neg_inf)
            nth_best = torch.cat([nth_best, end_scores], dim=1).topk(cfg.nbest, dim=1).values
            width = width - ends.sum(1)
            e_sent, e_rank = ends.nonzero(as_tuple=True)
            e_hist = history[parent[e_sent, e_rank]].tolist()
            e_ids = sent_id[e_sent].tolist()
            e_scores, e_logp = end_scores[e_sent, e_rank].tolist(), cand_logp[e_sent, e_rank].tolist()
            for i, score, log_prob, hist in zip(e_ids, e_scores, e_logp, e_hist):
                finished[i].append((score, log_prob, hist))

        done = (width == 0) | ~grows.any(1)
        if stop_early:
            best_alive = torch.where(grows, cand_logp, neg_inf).amax(1)
            longest = lp(max_len + 1).clamp(min=lp(float(step + 2)))  # lp is monotone in |Y|
            done |= nth_best[:, -1] >= best_alive / longest

        keep = grows & ~done[:, None]
        k_sent, k_rank = keep.nonzero(as_tuple=True)  # sentence-major, best first
        if k_sent.numel() == 0:
            break
        new_parent = parent[k_sent, k_rank]
        row_slot = (keep.cumsum(1) - 1)[k_sent, k_rank]
        if bool(done.any()):
            still = ~done
            row_sent = (still.cumsum(0) - 1)[k_sent]
            sent_id, max_len, width, nth_best = sent_id[still], max_len[still], width[still], nth_best[still]
        else:
            row_sent = k_sent
        tokens = cand_tok[k_sent, k_rank]
        row_logp = cand_logp[k_sent, k_rank]
        history = torch.cat([history[new_parent], tokens[:, None]], dim=1)
        if n_rows != new_parent.numel() or not torch.equal(new_parent, torch.arange(n_rows, device=device)):
            for state in states:
                state.reorder(new_parent)
        step += 1

    return [
        [Hypothesis(tokens=h, score=s, log_prob=p) for s, p, h in sorted(hyps, key=lambda x: -x[0])[: cfg.nbest]]
        for hyps in finished
    ]
