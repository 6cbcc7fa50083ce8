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

The per-sentence bookkeeping is plain Python over a few dozen candidates; the decoder steps
are the plain search's (`row_candidates`, `DecoderState.reorder`). Lines without constraints
never come here (`nmt.inference.model_decoder`), so they search exactly as without this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.inference.beam_search import LengthPenalty, max_output_lengths, row_candidates, special_ids
from nmt.inference.config import SearchConfig
from nmt.inference.hypothesis import Hypothesis, TargetRequest
from nmt.model.transformer import Transformer


@dataclass(frozen=True)
class ConstraintState:
    """How far one hypothesis is into its sentence's phrases."""

    phrases: tuple[tuple[int, ...], ...]
    met: tuple[bool, ...]
    partial: tuple[tuple[int, int], ...] = ()
    """(phrase, tokens matched) of the unmet phrases the hypothesis is inside now."""

    @classmethod
    def start(cls, phrases: Sequence[Sequence[int]]) -> "ConstraintState":
        phrases = tuple(tuple(p) for p in phrases)
        return cls(phrases, (False,) * len(phrases))

    @property
    def bank(self) -> int:
        """Constraint tokens met: whole phrases, plus the progress into the current one."""
        done = sum(len(p) for p, m in zip(self.phrases, self.met) if m)
        return done + max((n for _, n in self.partial), default=0)

    @property
    def complete(self) -> bool:
        return all(self.met)

    def next_tokens(self) -> set[int]:
        """Tokens that advance this state: the next token of a phrase it is in, or the first of an unmet one."""
        tokens = {self.phrases[c][n] for c, n in self.partial}
        tokens.update(p[0] for p, m in zip(self.phrases, self.met) if not m)
        return tokens

    def advance(self, token: int) -> "ConstraintState":
        """The state after `token`."""
        if self.complete:
            return self
        partial = [(c, n + 1) for c, n in self.partial if self.phrases[c][n] == token]
        partial += [(c, 1) for c, (p, m) in enumerate(zip(self.phrases, self.met))
                    if not m and p[0] == token and (c, 1) not in partial]
        met = list(self.met)
        finished = [c for c, n in partial if n == len(self.phrases[c])]
        if finished:
            met[finished[0]] = True  # two equal phrases need two occurrences: one is met per token
        partial = [(c, n) for c, n in partial if n < len(self.phrases[c]) and not met[c]]
        return ConstraintState(self.phrases, tuple(met), tuple(partial))


@dataclass
class _Hyp:
    log_prob: float
    tokens: list[int]
    state: ConstraintState


@dataclass
class _Sentence:
    index: int
    max_len: int
    prefix: tuple[int, ...]
    alive: list[Optional[_Hyp]]
    """k slots; None is a dead slot."""
    finished: list[tuple[bool, float, float, list[int]]] = field(default_factory=list)
    """(meets every phrase, score, log-probability, tokens)."""


def stripe(candidates: list[tuple[float, int, int, ConstraintState]], k: int) -> list[tuple[float, int, int, ConstraintState]]:
    """The k candidates (log-probability, row, token, state) dealt from the banks in turns,
    highest bank first, each bank's best first (fairseq's bank allocation)."""
    banks: dict[int, list] = {}
    for cand in sorted(candidates, key=lambda c: -c[0]):
        banks.setdefault(cand[3].bank, []).append(cand)
    order = sorted(banks, reverse=True)
    chosen: list = []
    depth = 0
    while len(chosen) < k and any(depth < len(banks[b]) for b in order):
        chosen += [banks[b][depth] for b in order if depth < len(banks[b])][: k - len(chosen)]
        depth += 1
    return chosen


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
    n_cand = 2 * k
    ends_within = k if cfg.beam_style == "fairseq" else n_cand
    vocab = models[0].cfg.tgt_vocab_size
    per_row = min(n_cand, vocab)
    device = src_tokens.device
    neg_inf = float("-inf")

    special = special_ids(models)
    eos = special.eos
    limits = max_output_lengths(src_tokens, cfg, min(m.cfg.max_positions for m in models), special.pad).tolist()
    sentences = []
    for i, (request, limit) in enumerate(zip(requests, limits)):
        if len(request.prefix) + sum(map(len, request.constraints)) > limit:
            raise NmtError("a line's prefix and constraints are longer than its output length limit (--max-len-a, --max-len-b)")
        start = _Hyp(0.0, [], ConstraintState.start(request.constraints))
        sentences.append(_Sentence(i, limit, tuple(request.prefix), [start] + [None] * (k - 1)))
    states = [m.init_decoder_state(m.encode(src_tokens), beam=k) for m in models]
    active = list(sentences)
    tokens = torch.full((len(active) * k,), special.bos, dtype=torch.long, device=device)
    step = 0
    while active:
        asked_lists = [sorted(h.state.next_tokens()) if h is not None else [] for s in active for h in s.alive]
        width = max(1, max(map(len, asked_lists)))
        asked = torch.full((len(asked_lists), width), special.pad, dtype=torch.long)
        for r, ids in enumerate(asked_lists):
            asked[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        cands = row_candidates(models, states, tokens, per_row, asked.to(device))
        best_vals, best_toks = cands.log_probs.tolist(), cands.tokens.tolist()
        eos_vals, asked_vals = cands.eos.tolist(), cands.asked.tolist()

        still, parents, next_tokens = [], [], []
        for a, sent in enumerate(active):
            rows = range(a * k, (a + 1) * k)
            forced = step < len(sent.prefix)
            at_limit = step == sent.max_len
            scored: dict[tuple[int, int], float] = {}  # (slot, token) -> log P of the extension
            for slot, r in enumerate(rows):
                hyp = sent.alive[slot]
                if hyp is None:
                    continue
                if forced:
                    scored[(slot, sent.prefix[step])] = 0.0  # a prefix is not scored (see nmt.inference.beam_search)
                elif at_limit:
                    scored[(slot, eos)] = hyp.log_prob + eos_vals[r]
                else:
                    for v, t in zip(best_vals[r], best_toks[r]):
                        scored[(slot, t)] = hyp.log_prob + v
                    for v, t in zip(asked_vals[r], asked_lists[r]):
                        scored[(slot, t)] = hyp.log_prob + v
            # eos may not end a hypothesis that misses a phrase (but must, at the limit)
            ranked = sorted(((v, slot, t) for (slot, t), v in scored.items()
                             if v > neg_inf and (t != eos or at_limit or sent.alive[slot].state.complete)),
                            key=lambda c: -c[0])
            after_prefix = step == len(sent.prefix) > 0  # only the best may end there, as in the plain search
            growing = []
            for rank, (v, slot, t) in enumerate(ranked):
                hyp = sent.alive[slot]
                if t == eos:
                    if at_limit or (rank < ends_within and not (after_prefix and rank > 0)):
                        score = lp.score(v, float(step + 1))
                        sent.finished.append((hyp.state.complete, score, v, hyp.tokens))
                elif not at_limit:
                    growing.append((v, slot, t, hyp.state.advance(t)))
            chosen = stripe(growing, k)
            done = at_limit or not chosen
            complete = sorted((f[1] for f in sent.finished if f[0]), reverse=True)
            if cfg.beam_style == "fairseq":
                done |= len(complete) >= k
            if len(complete) >= nbest and chosen:
                longest = max(lp(float(sent.max_len + 1)), lp(float(step + 2)))
                done |= complete[nbest - 1] >= max(c[0] for c in chosen) / longest
            if done:
                continue
            alive: list[Optional[_Hyp]] = []
            for v, slot, t, state in chosen:
                parents.append(a * k + slot)
                next_tokens.append(t)
                alive.append(_Hyp(v, sent.alive[slot].tokens + [t], state))
            for _ in range(k - len(chosen)):  # dead slots: any row, never chosen again
                parents.append(a * k)
                next_tokens.append(eos)
                alive.append(None)
            sent.alive = alive
            still.append(a)
        if not still:
            break
        keep = None if len(still) == len(active) else torch.tensor(still, dtype=torch.long, device=device)
        rows = torch.tensor(parents, dtype=torch.long, device=device)
        for state in states:
            state.reorder(rows, keep)
        active = [active[a] for a in still]
        tokens = torch.tensor(next_tokens, dtype=torch.long, device=device)
        step += 1

    return [[Hypothesis(tokens=toks, score=score, log_prob=log_prob)
             for _, score, log_prob, toks in sorted(s.finished, key=lambda f: (not f[0], -f[1]))[:nbest]]
            for s in sentences]
