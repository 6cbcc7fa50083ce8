"""Lexically constrained beam search: every given target phrase appears in the translation.

Dynamic beam allocation (Post and Vilar 2018, "Fast Lexically Constrained Decoding with
Dynamic Beam Allocation for Neural Machine Translation"), with the choices of fairseq's
`--constraints` (Hu et al. 2019's vectorised version of it): phrases are met in any order,
and the beam is shared between "banks", one per count of constraint tokens met so far.

One step, per sentence, over its k hypotheses:
  1. candidates: the sentence's 2k best one-token extensions (as the plain search), plus
     for every hypothesis its single best token and every token that would advance one of
     its unmet phrases (continue the phrase it is in, or start another);
  2. each candidate's bank: the tokens of the phrases it has met, plus how far it is into
     the phrase it is in (a token off the phrase drops that progress);
  3. eos may end only a hypothesis that has met every phrase; which eos candidates finish
     follows --beam-style (t2t: any of the 2k best; fairseq: among the k best);
  4. the k hypotheses that stay alive are dealt from the banks in turns, highest bank first,
     each bank's best first (fairseq's "striping"): the hypothesis furthest into its
     constraints always survives, so a sentence with a length limit of at least the
     constraints' tokens meets them all.
A sentence stops at its length limit, when no hypothesis is alive, by its style's rule, or by
the plain search's exact early termination (log-probabilities only fall as a hypothesis grows).
At the limit eos is forced: a hypothesis that has not met every phrase by then may finish, but
ranks below every one that has, and the Translator counts and reports such lines.

Steps 1-4 run as tensor operations over every candidate of every sentence of the batch at
once (`ConstraintStates`, `deal`); only the k survivors' states are built, the others' banks
are computed from their parents' (`ConstraintStates.banks_after`): per-candidate Python made a
line with many phrases at a wide beam cost several times its plain search
(`bench/bench_constraints.py --phrase-cost`,
bench/results/2026-12-07_b443580_sapphire-rapids_bench-constraints-phrase-cost.json). Log-probabilities add up in float64, as the
Python floats of the first version did, so its results are kept to the last bit. The decoder
steps are the plain search's (`row_candidates`, `DecoderState.reorder`). Lines without
constraints never come here (`nmt.inference.model_decoder`), so they search exactly as without this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.inference.beam_search import LengthPenalty, _prefix_tensors, max_output_lengths, row_candidates, special_ids
from nmt.inference.config import SearchConfig
from nmt.inference.hypothesis import Hypothesis, TargetRequest
from nmt.model.transformer import Transformer

NO_TOKEN = -1
"""Fills phrase tensors past a phrase's end: no token matches it."""


@dataclass
class ConstraintStates:
    """How far each of R hypotheses (rows) is into its sentence's C phrases of at most L tokens.

    `matched[r, c, n]`: row r has just generated the first n tokens of phrase c (n = 0: it may
    start the phrase, which is unmet). A phrase may be matched at several depths at once
    ("1 1" into "1 1 2" is also "1" into it), so "1 1 1 2" still meets it."""

    phrases: Tensor
    """(R, C, L) the row's sentence's phrase tokens, NO_TOKEN past their ends and for absent phrases."""
    lengths: Tensor
    """(R, C) phrase lengths, 0 for an absent phrase (a sentence with fewer phrases than C)."""
    met: Tensor
    """(R, C) bool: phrases the row has met; absent ones count as met."""
    matched: Tensor
    """(R, C, L) bool, see above."""

    @classmethod
    def start(cls, phrases: Sequence[Sequence[Sequence[int]]], beam: int, device: torch.device) -> "ConstraintStates":
        """The start of `beam` rows per sentence, given each sentence's phrases."""
        n_phrases = max(1, max(map(len, phrases)))
        longest = max([1] + [len(p) for sentence in phrases for p in sentence])
        tokens = torch.full((len(phrases), n_phrases, longest), NO_TOKEN, dtype=torch.long)
        lengths = torch.zeros(len(phrases), n_phrases, dtype=torch.long)
        for i, sentence in enumerate(phrases):
            for c, phrase in enumerate(sentence):
                tokens[i, c, : len(phrase)] = torch.tensor(phrase, dtype=torch.long)
                lengths[i, c] = len(phrase)
        met = lengths == 0
        matched = torch.zeros(tokens.shape, dtype=torch.bool)
        matched[:, :, 0] = ~met
        return cls(*(t.to(device).repeat_interleave(beam, dim=0) for t in (tokens, lengths, met, matched)))

    def __getitem__(self, rows: Tensor) -> "ConstraintStates":
        return ConstraintStates(self.phrases[rows], self.lengths[rows], self.met[rows], self.matched[rows])

    @property
    def bank(self) -> Tensor:
        """(R,) constraint tokens met: whole phrases, plus the progress into the current one."""
        depth = torch.arange(self.phrases.size(2), device=self.phrases.device)
        return self._met_tokens() + (self.matched.any(1) * depth).amax(1)

    @property
    def complete(self) -> Tensor:
        """(R,) bool: every phrase met."""
        return self.met.all(1)

    def advance(self, tokens: Tensor) -> "ConstraintStates":
        """The rows' states after one token each, (R,) ids.

        Where phrases end on the same token, one is met per token (two equal phrases need two
        occurrences): the longest, the first given among equals. Progress into that phrase,
        and into any other that ended, is dropped."""
        hit, first, meets = self._hits(tokens[:, None])
        hit, first, meets = hit[:, 0], first[:, 0], meets[:, 0]
        met = self.met | ((self._phrase_ids() == first[:, None]) & meets[:, None])
        depth = torch.arange(self.phrases.size(2), device=tokens.device)
        matched = torch.cat([~met[:, :, None], hit[:, :, :-1]], dim=2)  # n matched and hit: n + 1 matched
        matched &= (depth < self.lengths[:, :, None]) & ~met[:, :, None]
        return ConstraintStates(self.phrases, self.lengths, met, matched)

    def banks_after(self, tokens: Tensor) -> Tensor:
        """(R, X) the bank of each row after each of its X next tokens, (R, X) ids: what
        `advance(...).bank` gives, without building the X states (only k of them live on)."""
        hit, first, meets = self._hits(tokens)
        newly_met = (self._phrase_ids() == first[:, :, None]) & meets[:, :, None]  # (R, X, C)
        depth = torch.arange(1, self.phrases.size(2), device=tokens.device)
        going = hit[..., :-1] & ~newly_met[..., None] & (depth < self.lengths[:, None, :, None])  # (R, X, C, L-1): n+1 matched
        deepest = torch.cat([torch.zeros_like(tokens[:, :, None]), going.any(2) * depth], dim=2).amax(2)
        return self._met_tokens()[:, None] + torch.where(meets, self.lengths.gather(1, first), 0) + deepest

    def _hits(self, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """For (R, X) next tokens: where each continues a match, (R, X, C, L); the phrase it
        meets, (R, X), and whether it meets one, (R, X)."""
        hit = self.matched[:, None] & (self.phrases[:, None] == tokens[:, :, None, None])
        last = (torch.arange(self.phrases.size(2), device=tokens.device) == (self.lengths - 1)[:, :, None])  # (R, C, L)
        ends = (hit & last[:, None]).any(3)  # (R, X, C)
        n_phrases = self.lengths.size(1)
        order = self.lengths * n_phrases + torch.arange(n_phrases - 1, -1, -1, device=tokens.device)  # longest, then first
        first = torch.where(ends, order[:, None], -1).argmax(2)
        return hit, first, ends.any(2)

    def _met_tokens(self) -> Tensor:
        return (self.lengths * self.met).sum(1)

    def _phrase_ids(self) -> Tensor:
        return torch.arange(self.lengths.size(1), device=self.lengths.device)

    def next_tokens(self, pad: int) -> Tensor:
        """(R, E) the tokens that advance each row, ascending, each once, then pad."""
        beyond = torch.iinfo(torch.long).max
        ids = torch.where(self.matched, self.phrases, beyond).flatten(1).sort(1).values
        ids[:, 1:].masked_fill_(ids[:, 1:] == ids[:, :-1], beyond)
        ids = ids.sort(1).values
        ids = ids[:, : max(1, int((ids != beyond).sum(1).max()))]
        return ids.masked_fill(ids == beyond, pad)


def deal(banks: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Fairseq's bank allocation: from each sentence's candidates in rank order, (N, W) banks
    (-1: not a candidate), the positions of k of them dealt from the banks in turns, highest
    bank first, each bank's best first, (N, k), and whether each is a candidate, (N, k)."""
    width = banks.size(1)
    by_bank = torch.sort(-banks, dim=1, stable=True)  # highest bank first, rank order within; -1s last
    turn = torch.arange(width, device=banks.device) - torch.searchsorted(by_bank.values, by_bank.values)
    deal_key = torch.where(by_bank.values <= 0, turn * width + torch.arange(width, device=banks.device), width * width)
    dealt = deal_key.topk(k, dim=1, largest=False)
    return by_bank.indices.gather(1, dealt.indices), dealt.values < width * width


@torch.inference_mode()
def constrained_beam_search(
    models: Union[Transformer, Sequence[Transformer]],
    src_tokens: Tensor,
    cfg: SearchConfig,
    requests: Sequence[TargetRequest],
) -> list[list[Hypothesis]]:
    """Translate a batch whose sentences each give phrases (and maybe a prefix), in target ids.

    Returns, per sentence, its `cfg.nbest` best finished hypotheses: those that meet every
    phrase first, each group by score."""
    models = [models] if isinstance(models, Transformer) else list(models)
    cfg.validate()
    if cfg.beam_style == "shrink":
        raise NmtError("--constraints searches with --beam-style t2t or fairseq, not shrink")
    lp = LengthPenalty(cfg.lenpen, cfg.lenpen_style)
    k, nbest = cfg.beam, cfg.nbest
    ends_within = k if cfg.beam_style == "fairseq" else 2 * k
    per_row = min(2 * k, models[0].cfg.tgt_vocab_size)
    device = src_tokens.device
    neg_inf = float("-inf")

    special = special_ids(models)
    eos = special.eos
    max_len = max_output_lengths(src_tokens, cfg, min(m.cfg.max_positions for m in models), special.pad)
    limits = max_len.tolist()
    for request, limit in zip(requests, limits):
        if len(request.prefix) + sum(map(len, request.constraints)) > limit:
            raise NmtError("a line's prefix and constraints are longer than its output length limit (--max-len-a, --max-len-b)")
    prefix, prefix_len = _prefix_tensors([r.prefix for r in requests], len(requests), device, special.pad)
    states = [m.init_decoder_state(m.encode(src_tokens), beam=k) for m in models]
    # Per active sentence, and per row (k a sentence).
    sent_id = torch.arange(len(requests), device=device)
    progress = ConstraintStates.start([r.constraints for r in requests], k, device)
    logp = torch.full((len(requests), k), neg_inf, dtype=torch.float64, device=device)  # -inf: a dead slot
    logp[:, 0] = 0.0
    tokens = torch.full((len(requests) * k,), special.bos, dtype=torch.long, device=device)
    history = torch.empty(len(requests) * k, 0, dtype=torch.long, device=device)  # (rows, t) tokens so far
    finished: list[list[tuple[bool, float, float, list[int]]]] = [[] for _ in requests]
    """Per sentence: (meets every phrase, score, log-probability, tokens)."""
    step = 0
    while True:
        n = sent_id.numel()
        asked = progress.next_tokens(special.pad)  # (rows, E)
        cands = row_candidates(models, states, tokens, per_row, asked)
        # Each row's candidates: its best tokens, then the asked ones that are not among them.
        vals = torch.cat([cands.log_probs, cands.asked], dim=1).double()  # (rows, per_row + E)
        toks = torch.cat([cands.tokens, asked], dim=1)
        vals[:, per_row:].masked_fill_((asked[:, :, None] == cands.tokens[:, None, :]).any(2), neg_inf)
        forced = (prefix_len[sent_id] > step).repeat_interleave(k)
        if bool(forced.any()):  # a prefix is not scored (see nmt.inference.beam_search)
            vals[forced] = neg_inf
            vals[forced, 0] = 0.0
            toks[forced, 0] = prefix[sent_id, min(step, prefix.size(1) - 1)].repeat_interleave(k)[forced]
        at_limit = max_len[sent_id] == step  # (n,)
        if bool(at_limit.any()):
            rows = at_limit.repeat_interleave(k)
            vals[rows] = neg_inf
            vals[rows, 0] = cands.eos[rows].double()
            toks[rows, 0] = eos
        banks = progress.banks_after(toks)
        width = k * vals.size(1)
        total = (logp.view(-1, 1) + vals).view(n, width)  # (n, W) in (slot, candidate) order
        toks, banks = toks.view(n, width), banks.view(n, width)
        slot = torch.arange(width, device=device).div(vals.size(1), rounding_mode="floor").expand(n, width)
        # eos may not end a hypothesis that misses a phrase (but must, at the limit)
        parent_complete = progress.complete.view(n, k).gather(1, slot)
        valid = (total > neg_inf) & ((toks != eos) | at_limit[:, None] | parent_complete)
        order = torch.sort(torch.where(valid, -total, float("inf")), dim=1, stable=True).indices  # best first, ties in order
        total, toks, slot, valid, banks = (t.gather(1, order) for t in (total, toks, slot, valid, banks))
        rank = torch.arange(width, device=device)
        is_eos = toks == eos
        after_prefix = ((prefix_len[sent_id] == step) & (prefix_len[sent_id] > 0))[:, None]  # only the best may end there
        ends = valid & is_eos & (at_limit[:, None] | ((rank < ends_within) & ~(after_prefix & (rank > 0))))
        grows = valid & ~is_eos & ~at_limit[:, None]

        pick, picked = deal(torch.where(grows, banks, -1), k)  # (n, k)
        new_logp = torch.where(picked, total.gather(1, pick), neg_inf)
        first_row = torch.arange(n, device=device)[:, None] * k
        parent = torch.where(picked, first_row + slot.gather(1, pick), first_row)  # dead slots: any row, never chosen again
        new_tokens = torch.where(picked, toks.gather(1, pick), eos)

        if bool(ends.any()):
            e_sent, e_pos = ends.nonzero(as_tuple=True)  # each sentence's in rank order
            e_rows = e_sent * k + slot[e_sent, e_pos]
            for i, complete, log_prob, hist in zip(sent_id[e_sent].tolist(), progress.complete[e_rows].tolist(),
                                                   total[e_sent, e_pos].tolist(), history[e_rows].tolist()):
                finished[i].append((complete, lp.score(log_prob, float(step + 1)), log_prob, hist))

        still = []
        for a, (i, stop, alive, best) in enumerate(zip(sent_id.tolist(), at_limit.tolist(), picked[:, 0].tolist(),
                                                       new_logp.amax(1).tolist())):
            done = stop or not alive
            complete = sorted((f[1] for f in finished[i] if f[0]), reverse=True)
            if cfg.beam_style == "fairseq":
                done |= len(complete) >= k
            if len(complete) >= nbest and alive:
                longest = max(lp(float(limits[i] + 1)), lp(float(step + 2)))
                done |= complete[nbest - 1] >= best / longest
            if not done:
                still.append(a)
        if not still:
            break
        keep = None if len(still) == n else torch.tensor(still, dtype=torch.long, device=device)
        if keep is not None:
            parent, new_tokens, new_logp, sent_id = (t[keep] for t in (parent, new_tokens, new_logp, sent_id))
        rows = parent.view(-1)
        for state in states:
            state.reorder(rows, keep)
        tokens, logp = new_tokens.view(-1), new_logp
        progress = progress[rows].advance(tokens)
        history = torch.cat([history[rows], tokens[:, None]], dim=1)
        step += 1

    return [[Hypothesis(tokens=toks, score=score, log_prob=log_prob)
             for _, score, log_prob, toks in sorted(f, key=lambda f: (not f[0], -f[1]))[:nbest]]
            for f in finished]
