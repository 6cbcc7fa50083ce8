"""Beam search with length penalty (Section 6.1 of the paper: beam 4, alpha 0.6).

The search runs over whole tensors: every sentence of a batch owns `beam` adjacent rows of
one decoder batch (dead rows carry log-probability -inf), advanced one token per step with
the model's key/value cache (`Transformer.decode_step_hidden`); the encoder and its keys/values run
once per sentence and are shared by the sentence's rows, never copied per row.

One step, for every sentence at once:
  1. log-probabilities of the next token for every row: logits (float32 even under bf16
     weights) and their log-softmax (an ensemble averages its members' log-probabilities),
     for a block of rows at a time, each block reduced to its rows' best tokens before the
     next is projected;
  2. the sentence's candidates are its best one-token extensions by log-probability (all
     have the same length, so the length penalty would not change their order): 2k of them
     for `t2t` and `fairseq`, k for `shrink`;
  3. the style decides which candidates ending in eos join the finished set (scored with the
     length penalty) and which k stay alive (--beam-style; see `SearchConfig.beam_style`):
       t2t (tensor2tensor's beam_search.py, the paper's code): every eos candidate among
         the 2k may finish; the k best non-eos candidates stay alive;
       fairseq (fairseq's sequence_generator; CTranslate2 with patience 1): eos candidates
         among the k best finish; the k best non-eos candidates stay alive; the sentence
         stops once k hypotheses have finished;
       shrink (dl4mt, Nematus): eos candidates among the `width` best finish and take
         their slot with them, so the beam narrows (beam 1 is greedy search);
  4. a sentence stops at its maximum length (eos is forced there, as in fairseq), when no
     hypothesis is alive, by its style's rule, or -- exact early termination, t2t's rule,
     applied to every style because it never changes a result -- when no alive hypothesis
     can still beat the n-th best finished one: log-probabilities only fall as a hypothesis
     grows, so the best any extension of an alive hypothesis can score is its
     log-probability over the largest penalty among the lengths it may still reach.
Finished sentences leave the batch (their rows are dropped from the decoder state), so the
late steps of a batch cost only what is still being searched.

A forced target prefix (`prefixes`, CTranslate2's `target_prefix`) takes the first steps of
its sentence: one hypothesis, extended by the prefix's next token at each step, with its
log-probability held at 0, so a score counts the tokens after the prefix while |Y| counts
the whole output, as CTranslate2 scores it. At the first free step only the best candidate
may end the sentence (CTranslate2's rule, its issue #277: an eos among the other candidates
right after a prefix gave short translations that the length penalty then preferred); an eos
candidate below it is dropped and takes its slot with it, as in CTranslate2.

|Y| counts the end-of-sentence token in both length-penalty styles (tensor2tensor and
fairseq both do). pad and bos are never generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.model.incremental import DecoderState
from nmt.model.transformer import Transformer
from nmt.model.config import SpecialIds
from nmt.inference.config import LENPEN_STYLES, SearchConfig
from nmt.inference.hypothesis import Hypothesis
from nmt.ops import fused_vocabulary_top


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


def special_ids(models: Sequence[Transformer]) -> SpecialIds:
    """The special ids the models share (an ensemble of models with other ids is refused)."""
    ids = {m.cfg.special_ids for m in models}
    if len(ids) != 1:
        raise NmtError("the ensembled checkpoints have different special token ids; ensemble models of one run")
    return ids.pop()


def max_output_lengths(src_tokens: Tensor, cfg: SearchConfig, max_positions: int, pad_id: int) -> Tensor:
    """Tokens each sentence may generate before eos (`SearchConfig.max_output_length`), (N,)."""
    src_len = (src_tokens.ne(pad_id).sum(1) - 1).tolist()  # |X| excludes eos; once per batch
    return torch.tensor([cfg.max_output_length(n, max_positions) for n in src_len], device=src_tokens.device)


@dataclass
class RowCandidates:
    """Each decoder row's best next tokens, without the (rows, V) scores they came from."""

    log_probs: Tensor
    """(rows, per_row) log-probabilities, best first."""
    tokens: Tensor
    """(rows, per_row) their token ids."""
    eos: Tensor
    """(rows,) log-probability of eos, which a sentence at its length limit must take."""
    asked: Optional[Tensor] = None
    """(rows, E) log-probabilities of the tokens asked for by id (constrained search)."""


LOGIT_BLOCK_ELEMENTS = 1 << 21
"""Logits written at a time on CPU (8 MiB in fp32): the (rows, V) logits of a whole batch were
the CPU search's largest temporary (35 MiB for 1,168 rows of an 8,000-piece vocabulary). On a
GPU the whole batch is projected at once: memory is plentiful there, kernel launches are not."""


def row_candidates(models: Sequence[Transformer], states: Sequence[DecoderState], tokens: Tensor,
                   per_row: int, asked: Optional[Tensor] = None) -> RowCandidates:
    """Advance every model one step and rank each row's next tokens (pad and bos are never
    generated). The vocabulary projection runs a block of rows at a time, so the logits of
    the whole batch never exist at once; log P = log_softmax(logits), and an ensemble
    averages its members' log-probabilities. `asked` (rows, E) token ids also get their
    log-probabilities (pad asks for nothing: -inf). A model searched alone may do the
    log-softmax and ranking of a block in one pass of its own (`nmt.ops.fused_vocabulary_top`)."""
    hidden = [m.decode_step_hidden(tokens, s) for m, s in zip(models, states)]
    ids = models[0].cfg.special_ids
    n_rows = tokens.numel()
    vocab = models[0].cfg.tgt_vocab_size
    block = n_rows if tokens.device.type != "cpu" else max(1, LOGIT_BLOCK_ELEMENTS // vocab)
    log_probs = torch.empty(n_rows, per_row, device=tokens.device)
    best = torch.empty(n_rows, per_row, dtype=torch.long, device=tokens.device)
    eos = torch.empty(n_rows, device=tokens.device)
    asked_log_probs = None if asked is None else torch.empty(asked.shape, device=tokens.device)
    fused = fused_vocabulary_top(models[0]) if len(models) == 1 and asked is None else None
    for start in range(0, n_rows, block):
        rows = slice(start, start + block)
        if fused is not None:  # the same, in one pass over each row of the block (nmt.ops.vocabulary_top)
            fused(models[0].project_fp32(hidden[0][rows]), log_probs[rows], best[rows], eos[rows])
            continue
        scores = None
        for model, h in zip(models, hidden):
            logits = model.project_fp32(h[rows])
            lprobs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: one block less to write
            scores = lprobs if scores is None else scores.add_(lprobs)
        if len(models) > 1:
            scores.div_(len(models))
        scores[:, ids.pad] = float("-inf")
        scores[:, ids.bos] = float("-inf")
        log_probs[rows], best[rows] = _row_topk(scores, per_row)
        eos[rows] = scores[:, ids.eos]
        if asked is not None:
            asked_log_probs[rows] = scores.gather(1, asked[rows])
    return RowCandidates(log_probs, best, eos, asked_log_probs)


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


def _prefix_tensors(prefixes: Optional[Sequence[Sequence[int]]], n_sent: int, device: torch.device,
                    pad_id: int) -> tuple[Tensor, Tensor]:
    """(N, P) prefix tokens (right-padded) and (N,) their lengths; P is 0 without prefixes."""
    lengths = [len(p) for p in prefixes] if prefixes is not None else [0] * n_sent
    prefix = torch.full((n_sent, max(lengths, default=0)), pad_id, dtype=torch.long)
    for i, p in enumerate(prefixes or []):
        prefix[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return prefix.to(device), torch.tensor(lengths, dtype=torch.long, device=device)


@torch.inference_mode()
def beam_search(
    models: Union[Transformer, Sequence[Transformer]],
    src_tokens: Tensor,
    cfg: SearchConfig,
    stop_early: bool = True,
    prefixes: Optional[Sequence[Sequence[int]]] = None,
) -> list[list[Hypothesis]]:
    """Translate a batch: src_tokens (N, S) right-padded with pad, eos-terminated.

    Returns, per sentence, its `cfg.nbest` best finished hypotheses, best first. `prefixes`
    gives each sentence the target tokens its translations start with (empty: none); each must
    fit the sentence's length limit (the Translator checks that first, naming the line).
    `stop_early=False` searches every sentence until its style's own rule stops it (t2t: to
    its length limit); results are the same (that is what makes the early termination
    exact), only slower.
    """
    models = [models] if isinstance(models, Transformer) else list(models)
    cfg.validate()
    if len({m.cfg.tgt_vocab_size for m in models}) != 1:
        raise NmtError("the ensembled checkpoints have different target vocabularies; ensemble models of one run")
    ids = special_ids(models)
    lp = LengthPenalty(cfg.lenpen, cfg.lenpen_style)
    style, k, nbest = cfg.beam_style, cfg.beam, cfg.nbest
    device = src_tokens.device
    n_sent = src_tokens.size(0)
    vocab = models[0].cfg.tgt_vocab_size
    n_cand = k if style == "shrink" else 2 * k
    per_row = min(n_cand, vocab)  # a sentence's best n_cand extensions lie among its rows' best per_row
    n_cand = min(n_cand, k * per_row)
    neg_inf = float("-inf")

    states = [m.init_decoder_state(m.encode(src_tokens), beam=k) for m in models]

    # Per active sentence.
    sent_id = torch.arange(n_sent, device=device)  # index into the batch
    max_len = max_output_lengths(src_tokens, cfg, min(m.cfg.max_positions for m in models), ids.pad)
    forcing = prefixes is not None and any(prefixes)  # without, a step runs no prefix bookkeeping at all
    prefix, prefix_len = _prefix_tensors(prefixes if forcing else None, n_sent, device, ids.pad)
    if forcing and bool((prefix_len > max_len).any()):
        raise NmtError("a target prefix is longer than its sentence's output length limit (--max-len-a, --max-len-b)")
    width = torch.full((n_sent,), k, dtype=torch.long, device=device)  # shrink: beam slots still open
    n_finished = torch.zeros(n_sent, dtype=torch.long, device=device)
    nth_best = torch.full((n_sent, nbest), neg_inf, device=device)  # best finished scores, sorted
    # Per row: `width_rows` per sentence. The first step has one hypothesis per sentence (bos),
    # so it runs one row per sentence, as CTranslate2 does, when that row alone holds the
    # n_cand candidates; then k rows, each the child of a row of the step before.
    width_rows = 1 if per_row >= n_cand else k
    logp = torch.full((n_sent, width_rows), neg_inf, device=device)
    logp[:, 0] = 0.0
    first_row = torch.arange(n_sent, device=device)[:, None] * width_rows  # (N, 1)
    tokens = torch.full((n_sent * width_rows,), ids.bos, dtype=torch.long, device=device)
    history = torch.empty(n_sent * width_rows, 0, dtype=torch.long, device=device)  # (rows, t) tokens so far
    finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(n_sent)]
    rank = torch.arange(n_cand, device=device)

    step = 0
    while True:
        n_active = sent_id.numel()
        # The sentence's best n_cand extensions, from its rows' best per_row.
        cands = row_candidates(models, states, tokens, per_row)
        row_vals, row_tok = cands.log_probs, cands.tokens  # (rows, per_row)
        forced = prefix_len > step if forcing else None  # (N,) the prefix gives the next token
        if forced is not None and bool(forced.any()):
            row_vals[forced.repeat_interleave(width_rows)] = neg_inf
            forced_rows = first_row[forced, 0]
            row_vals[forced_rows, 0] = 0.0  # a prefix's log-probability is not counted (see above)
            row_tok[forced_rows, 0] = prefix[forced, step]
        at_limit = max_len == step  # (N,) only eos may follow
        if bool(at_limit.any()):
            rows = at_limit.repeat_interleave(width_rows)
            row_vals[rows] = neg_inf
            row_vals[rows, 0] = cands.eos[rows]
            row_tok[rows, 0] = ids.eos
        row_vals += logp.view(-1, 1)
        cand_logp, cand_pos = row_vals.view(n_active, width_rows * per_row).topk(n_cand, dim=1)  # sorted, best first
        cand_slot = cand_pos // per_row  # which of the sentence's rows each candidate extends
        cand_tok = row_tok.view(n_active, width_rows * per_row).gather(1, cand_pos)
        valid = cand_logp > neg_inf
        is_eos = cand_tok == ids.eos
        after_prefix = (prefix_len == step) & (prefix_len > 0) if forcing else None
        if after_prefix is not None and bool(after_prefix.any()):  # only the best may end: a lower eos becomes a dead slot
            dropped = after_prefix[:, None] & is_eos & (rank > 0)
            cand_logp = cand_logp.masked_fill(dropped, neg_inf)
            is_eos = is_eos & ~dropped
        grows = valid & ~is_eos
        ends = valid & is_eos
        if style == "fairseq":
            ends &= rank < k
        elif style == "shrink":
            in_beam = rank < width[:, None]
            ends &= in_beam
            grows &= in_beam

        # The k best growing candidates stay alive (rows of a sentence keep candidate order).
        pick = torch.where(grows, rank, rank + n_cand).topk(k, dim=1, largest=False).indices  # (N, k)
        alive = grows.gather(1, pick)
        new_logp = torch.where(alive, cand_logp.gather(1, pick), neg_inf)
        parent = first_row + cand_slot.gather(1, pick)  # (N, k) row each survivor extends
        new_tokens = cand_tok.gather(1, pick)

        if bool(ends.any()):
            end_scores = torch.where(ends, lp.score(cand_logp, float(step + 1)), neg_inf)  # |Y|: tokens + eos
            nth_best = torch.cat([nth_best, end_scores], dim=1).topk(nbest, dim=1).values
            n_ends = ends.sum(1)
            n_finished += n_ends
            width -= n_ends
            e_sent, e_rank = ends.nonzero(as_tuple=True)
            e_hist = history[first_row[e_sent, 0] + cand_slot[e_sent, e_rank]].tolist()
            e_ids = sent_id[e_sent].tolist()
            e_scores, e_logp = end_scores[e_sent, e_rank].tolist(), cand_logp[e_sent, e_rank].tolist()
            for i, score, log_prob, hist in zip(e_ids, e_scores, e_logp, e_hist):
                finished[i].append((score, log_prob, hist))

        done = at_limit | ~alive[:, 0]
        if style == "fairseq":
            done |= n_finished >= k
        if stop_early:
            longest = torch.maximum(lp(max_len + 1), lp(torch.tensor(float(step + 2))))  # lp is monotone in |Y|
            done |= nth_best[:, -1] >= new_logp[:, 0] / longest

        still = ~done
        n_still = int(still.sum())
        if n_still == 0:
            break
        sentences = None
        if n_still < n_active:
            sentences = still.nonzero().squeeze(1)
            parent, new_tokens, new_logp = parent[sentences], new_tokens[sentences], new_logp[sentences]
            sent_id, max_len, width = sent_id[sentences], max_len[sentences], width[sentences]
            if forcing:
                prefix, prefix_len = prefix[sentences], prefix_len[sentences]
            n_finished, nth_best = n_finished[sentences], nth_best[sentences]
        rows = parent.view(-1)
        tokens, logp = new_tokens.view(-1), new_logp
        history = torch.cat([history[rows], tokens[:, None]], dim=1)
        for state in states:
            state.reorder(rows, sentences)
        width_rows = k
        first_row = torch.arange(n_still, device=device)[:, None] * k
        step += 1

    return [
        [Hypothesis(tokens=h, score=s, log_prob=p) for s, p, h in sorted(hyps, key=lambda x: -x[0])[:nbest]]
        for hyps in finished
    ]
