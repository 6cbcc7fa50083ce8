"""Beam search finds what an exhaustive search finds, on the model's own incremental decoder."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from nmt.inference.hypothesis import Hypothesis
from nmt.inference.beam_search import LengthPenalty, SearchConfig, beam_search, max_output_lengths
from nmt.errors import NmtError
from nmt.model.transformer import Transformer
from nmt.model.config import build_config
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(vocab: int, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(build_config("tiny", vocab, vocab, **kw)).eval()


def _prefixes(rows: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """Random decoder inputs (rows, length) of ordinary tokens, each starting with bos."""
    prev = torch.randint(4, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))
    prev[:, 0] = BOS_ID
    return prev


def _batch(lengths: list[int], vocab: int, seed: int = 1) -> torch.Tensor:
    """Right-padded, eos-terminated random sources of `lengths` tokens (eos included)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src


def _sequence_log_probs(models: list[Transformer], src: torch.Tensor, outputs: list[list[int]]) -> list[float]:
    """log P(y + eos | x) by full recomputation (no cache), ensemble-averaged per token."""
    T = max(len(y) for y in outputs) + 1
    prev = torch.full((len(outputs), T), PAD_ID, dtype=torch.long)
    target = torch.full((len(outputs), T), PAD_ID, dtype=torch.long)
    for i, y in enumerate(outputs):
        prev[i, : len(y) + 1] = torch.tensor([BOS_ID, *y])
        target[i, : len(y) + 1] = torch.tensor([*y, EOS_ID])
    with torch.no_grad():
        lprobs = sum(F.log_softmax(m(src.expand(len(outputs), -1), prev), dim=-1) for m in models) / len(models)
    token_lp = lprobs.gather(2, target[:, :, None])[:, :, 0].masked_fill(target.eq(PAD_ID), 0.0)
    return token_lp.sum(1).tolist()


# -- length penalties -------------------------------------------------------------------

def test_gnmt_length_penalty_is_wu_et_al_formula():
    lp = LengthPenalty(alpha=0.6, style="gnmt")
    assert lp(10) == pytest.approx(((5 + 10) / 6) ** 0.6)
    assert lp(1) == pytest.approx(1.0)
    assert lp.score(-7.5, 10) == pytest.approx(-7.5 / (15 / 6) ** 0.6)
    lengths = torch.tensor([1, 4, 23])
    assert torch.allclose(lp(lengths), torch.tensor([1.0, (9 / 6) ** 0.6, (28 / 6) ** 0.6]))


def test_avg_length_penalty_is_length_to_the_alpha():
    lp = LengthPenalty(alpha=1.0, style="avg")
    assert lp.score(-12.0, 4) == pytest.approx(-3.0)  # alpha 1: mean log-probability per token
    lp = LengthPenalty(alpha=0.6, style="avg")
    assert lp(7) == pytest.approx(7**0.6)
    assert torch.allclose(lp.score(torch.tensor([-2.0, -9.0]), torch.tensor([2, 9])), torch.tensor([-2 / 2**0.6, -9 / 9**0.6]))


def test_unknown_length_penalty_style_is_a_user_error():
    with pytest.raises(NmtError, match="gnmt, avg"):
        LengthPenalty(0.6, "t2t")
    with pytest.raises(NmtError, match="--nbest"):
        SearchConfig(beam=2, nbest=3).validate()


# -- incremental decoding ---------------------------------------------------------------

def test_incremental_decoding_equals_full_recomputation_with_padding():
    vocab = 40
    model = _model(vocab)
    src = _batch([7, 3, 5], vocab)
    prev = _prefixes(3, 9, vocab, seed=3)
    with torch.inference_mode():
        full = F.log_softmax(model(src, prev), dim=-1)  # (B, T, V)
        state = model.init_decoder_state(model.encode(src))
        steps = torch.stack([F.log_softmax(model.decode_step(prev[:, t], state), dim=-1) for t in range(prev.size(1))], 1)
    assert (steps - full).abs().max().item() < 1e-5


def test_reordered_decoder_state_continues_the_chosen_rows():
    vocab = 40
    model = _model(vocab)
    src = _batch([6, 4, 5], vocab)
    prev = _prefixes(6, 14, vocab, seed=4)  # beam 2: rows 2i and 2i+1 belong to sentence i
    rows = torch.tensor([1, 1, 5, 4])  # sentence 1 leaves; survivors pick parents, one twice
    sentences = torch.tensor([0, 2])
    with torch.inference_mode():
        state = model.init_decoder_state(model.encode(src), beam=2)
        for t in range(11):  # past the cache's first capacity, so it grows too
            model.decode_step(prev[:, t], state)
        state.reorder(rows, sentences)
        cont = [F.log_softmax(model.decode_step(prev[rows, t], state), dim=-1) for t in range(11, 14)]
        full = F.log_softmax(model(src[sentences].repeat_interleave(2, 0), prev[rows]), dim=-1)
    assert (torch.stack(cont, 1) - full[:, 11:]).abs().max().item() < 1e-5


def test_rows_reordered_twice_then_grown_continue_the_chosen_rows():
    """The cache gathers surviving rows into the spare buffer its layers pass along (the
    buffers swap roles at every reorder); a later reorder, and growth past the capacity
    after it, must still continue the right rows."""
    vocab = 40
    model = _model(vocab)
    src = _batch([6, 4, 5], vocab)
    prev = _prefixes(6, 20, vocab, seed=5)
    first, second = torch.tensor([1, 0, 3, 3, 5, 4]), torch.tensor([1, 1, 5, 4])  # duplicates, then sentence 1 leaves
    with torch.inference_mode():
        state = model.init_decoder_state(model.encode(src), beam=2)
        for t in range(5):
            model.decode_step(prev[:, t], state)
        state.reorder(first)
        for t in range(5, 9):
            model.decode_step(prev[first, t], state)
        state.reorder(second, torch.tensor([0, 2]))
        rows = first[second]
        cont = [F.log_softmax(model.decode_step(prev[rows, t], state), dim=-1) for t in range(9, 20)]  # grows at 12 and 18
        history = torch.cat([prev[rows, :5], prev[first, 5:9][second], prev[rows, 9:]], dim=1)
        full = F.log_softmax(model(src[torch.tensor([0, 2])].repeat_interleave(2, 0), history), dim=-1)
    assert (torch.stack(cont, 1) - full[:, 9:]).abs().max().item() < 1e-5


# -- beam search against exhaustive search ----------------------------------------------

@pytest.mark.parametrize("beam_style", ["t2t", "fairseq", "shrink"])
@pytest.mark.parametrize("style,alpha", [("gnmt", 0.6), ("gnmt", 2.0), ("avg", 1.0), ("avg", 0.6)])
def test_wide_beam_finds_the_exhaustive_best_under_the_length_penalty(style, alpha, beam_style):
    """A beam as wide as the number of outputs prunes nothing, so every rule must find the
    exhaustive ranking (t2t's bound may stop it early only where nothing can change)."""
    vocab = 7  # pad unk bos eos + 3 words: unk and the words are the 4 tokens that may go before eos
    max_len = 3
    model = _model(vocab, seed=5)
    src = _batch([5], vocab, seed=6)
    words = [1, 4, 5, 6]
    outputs = [list(y) for n in range(max_len + 1) for y in itertools.product(words, repeat=n)]
    lp = LengthPenalty(alpha, style)
    log_probs = _sequence_log_probs([model], src, outputs)
    scored = sorted(((lp.score(p, len(y) + 1), p, y) for p, y in zip(log_probs, outputs)), key=lambda x: -x[0])

    cfg = SearchConfig(beam=len(outputs), lenpen=alpha, lenpen_style=style, max_len_a=0.0, max_len_b=max_len, nbest=3,
                       beam_style=beam_style)
    hyps = beam_search(model, src, cfg)[0]
    assert [h.tokens for h in hyps] == [y for _, _, y in scored[:3]]
    for h, (score, log_prob, _) in zip(hyps, scored):
        assert h.score == pytest.approx(score, abs=1e-5)
        assert h.log_prob == pytest.approx(log_prob, abs=1e-5)


def test_a_narrow_beam_scores_its_hypotheses_by_their_true_probability():
    vocab = 9
    model = _model(vocab, seed=7)
    src = _batch([6, 4], vocab, seed=8)
    cfg = SearchConfig(beam=3, nbest=3, max_len_b=6)
    lp = LengthPenalty(cfg.lenpen, cfg.lenpen_style)
    for i, hyps in enumerate(beam_search(model, src, cfg)):
        true = _sequence_log_probs([model], src[i : i + 1, : int(src[i].ne(PAD_ID).sum())], [h.tokens for h in hyps])
        for h, p in zip(hyps, true):
            assert h.log_prob == pytest.approx(p, abs=1e-5)
            assert h.score == pytest.approx(lp.score(p, len(h.tokens) + 1), abs=1e-5)  # |Y| counts eos
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


# -- greedy, batching, early termination ------------------------------------------------

def _greedy(models: list[Transformer], src: torch.Tensor, max_len: int, lp: LengthPenalty) -> Hypothesis:
    """The textbook loop: feed the argmax token until eos or the length limit."""
    states = [m.init_decoder_state(m.encode(src)) for m in models]
    token, tokens, log_prob = BOS_ID, [], 0.0
    with torch.inference_mode():
        for step in range(max_len + 1):
            lprobs = sum(F.log_softmax(m.decode_step(torch.tensor([token]), s), dim=-1)[0] for m, s in zip(models, states))
            lprobs = lprobs / len(models)
            lprobs[PAD_ID] = lprobs[BOS_ID] = -math.inf
            if step == max_len:
                token = EOS_ID
            else:
                token = int(lprobs.argmax())
            log_prob += float(lprobs[token])
            if token == EOS_ID:
                break
            tokens.append(token)
    return Hypothesis(tokens, lp.score(log_prob, len(tokens) + 1), log_prob)


@pytest.mark.parametrize("beam_style", ["fairseq", "shrink"])
@pytest.mark.parametrize("n_models", [1, 2])
def test_beam_one_is_greedy_search(n_models, beam_style):
    vocab = 12
    models = [_model(vocab, seed=10 + i) for i in range(n_models)]
    src = _batch([4, 9, 6, 2], vocab, seed=11)
    cfg = SearchConfig(beam=1, max_len_a=1.0, max_len_b=4, beam_style=beam_style)
    got = beam_search(models, src, cfg)
    lengths_seen = set()
    for i, (hyp,) in enumerate(got):
        n = int(src[i].ne(PAD_ID).sum())
        want = _greedy(models, src[i : i + 1, :n], (n - 1) + 4, LengthPenalty(cfg.lenpen, cfg.lenpen_style))
        assert hyp.tokens == want.tokens
        assert hyp.score == pytest.approx(want.score, abs=1e-5)
        lengths_seen.add(len(hyp.tokens))
    assert len(lengths_seen) > 1  # some stop at eos, some at the length limit


@pytest.mark.parametrize("beam_style", ["t2t", "fairseq", "shrink"])
def test_batched_search_equals_one_sentence_at_a_time(beam_style):
    vocab = 30
    model = _model(vocab, seed=12)
    src = _batch([3, 11, 7, 7, 2, 9], vocab, seed=13)
    cfg = SearchConfig(beam=4, nbest=2, max_len_b=8, beam_style=beam_style)
    together = beam_search(model, src, cfg)
    for i, hyps in enumerate(together):
        n = int(src[i].ne(PAD_ID).sum())
        alone = beam_search(model, src[i : i + 1, :n], cfg)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)


def test_early_termination_saves_steps_without_changing_results(monkeypatch):
    vocab = 10
    model = _model(vocab, seed=14)
    src = _batch([3, 8, 5, 6, 4, 7, 2, 5], vocab, seed=15)
    calls = []
    original = Transformer.decode_step_hidden

    def counting(self, tokens, state):
        calls.append(tokens.numel())
        return original(self, tokens, state)

    monkeypatch.setattr(Transformer, "decode_step_hidden", counting)
    # Small alphas: the bound is weak when lp(max length) is large, as with the paper's 0.6.
    for cfg in (SearchConfig(beam=4, nbest=2, lenpen=0.2, max_len_b=20), SearchConfig(beam=3, lenpen=0.3, lenpen_style="avg", max_len_b=20),
                SearchConfig(beam=4, nbest=2, lenpen=0.2, max_len_b=20, beam_style="shrink")):
        calls.clear()
        early = beam_search(model, src, cfg)
        rows_early = sum(calls)
        calls.clear()
        full = beam_search(model, src, cfg, stop_early=False)
        assert rows_early < sum(calls)
        for a, b in zip(early, full):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_output_length_is_capped_by_the_models_positions():
    vocab = 6
    model = _model(vocab, seed=16, max_positions=12)
    src = _batch([10], vocab, seed=17)
    hyps = beam_search(model, src, SearchConfig(beam=2, nbest=2, lenpen=5.0, max_len_b=50))[0]
    assert max(len(h.tokens) for h in hyps) <= 11  # bos + 11 tokens = 12 positions


def test_blockwise_topk_equals_torch_topk():
    from nmt.inference.beam_search import _row_topk

    g = torch.Generator().manual_seed(18)
    scores = torch.randn(50, 8000, generator=g)
    scores[:, [0, 2]] = -math.inf
    scores[3, :7900] = -math.inf  # a row whose best entries all sit in the last blocks
    for w in (1, 4, 5):
        values, indices = _row_topk(scores, w)
        expected = scores.topk(w, dim=1)
        assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


def test_scores_stay_float32_under_bf16_weights():
    vocab = 300
    model = _model(vocab, seed=19).to(torch.bfloat16)
    src = _batch([6, 4], vocab, seed=20)
    with torch.inference_mode():
        state = model.init_decoder_state(model.encode(src))
        logits = model.decode_step(torch.full((2,), BOS_ID), state)
    assert logits.dtype == torch.float32
    assert not torch.equal(logits, logits.to(torch.bfloat16).float())  # not bf16 values in disguise


# -- the three rules against a plain reference, on real sentences -----------------------

def _reference_search(model: Transformer, src: torch.Tensor, cfg: SearchConfig) -> list[Hypothesis]:
    """--beam-style written as plainly as possible, for one sentence: Python lists, the
    whole prefix re-decoded every step (no cache), no early termination.

    Each step ranks every one-token extension of the alive hypotheses by log-probability.
    t2t: every eos among the best 2k finishes, the best k others stay alive, until the
    length limit. fairseq: eos among the best k finish, the best k others stay alive, until
    k have finished. shrink: eos among the best `width` finish and close their slot, the
    others in those `width` stay alive, until no slot is open.
    """
    lp = LengthPenalty(cfg.lenpen, cfg.lenpen_style)
    k, style = cfg.beam, cfg.beam_style
    max_len = int(max_output_lengths(src, cfg, model.cfg.max_positions, model.cfg.pad_id)[0])
    alive: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[Hypothesis] = []
    width = k
    for step in range(max_len + 1):
        prev = torch.tensor([[BOS_ID, *y] for _, y in alive])
        with torch.inference_mode():
            lprobs = F.log_softmax(model(src.expand(len(alive), -1), prev)[:, -1].float(), dim=-1)
        candidates = [(logp + p, y, tok) for (logp, y), row in zip(alive, lprobs.tolist()) for tok, p in enumerate(row)
                      if tok not in (PAD_ID, BOS_ID) and (step < max_len or tok == EOS_ID)]
        candidates.sort(key=lambda c: -c[0])
        considered = candidates[: width if style == "shrink" else 2 * k]
        may_end = considered[:k] if style == "fairseq" else considered
        ended = [(logp, y) for logp, y, tok in may_end if tok == EOS_ID]
        finished += [Hypothesis(y, lp.score(logp, len(y) + 1), logp) for logp, y in ended]
        if style == "shrink":
            width -= len(ended)
        alive = [(logp, [*y, tok]) for logp, y, tok in considered if tok != EOS_ID][:k]
        if not alive or (style == "fairseq" and len(finished) >= k):
            break
    return sorted(finished, key=lambda h: -h.score)[: cfg.nbest]


@pytest.mark.slow
@pytest.mark.parametrize("beam_style,lenpen_style,n_lines", [("t2t", "gnmt", 16), ("fairseq", "avg", 16), ("shrink", "gnmt", 8)])
def test_batched_search_equals_a_plain_reference_on_real_sentences(trained_tiny_run, multi30k_dir, beam_style, lenpen_style, n_lines):
    import gzip

    from nmt.inference.translator import load_translator
    from nmt.inference.config import TranslateConfig

    translator = load_translator(trained_tiny_run, cfg=TranslateConfig(device="cpu"))
    model = translator.models[0]
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(n_lines), f)]
    ids = translator.src_tokenizer.encode(lines)
    cfg = SearchConfig(beam=4, nbest=2, beam_style=beam_style, lenpen_style=lenpen_style)
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD_ID, dtype=torch.long)
    for i, seq in enumerate(ids):
        src[i, : len(seq) + 1] = torch.tensor([*seq, EOS_ID])
    batched = beam_search(model, src, cfg)
    for i, seq in enumerate(ids):
        want = _reference_search(model, src[i : i + 1, : len(seq) + 1], cfg)
        assert [h.tokens for h in batched[i]] == [h.tokens for h in want], lines[i]
        assert [h.score for h in batched[i]] == pytest.approx([h.score for h in want], abs=1e-4)


@pytest.mark.parametrize("n_models", [1, 2])
def test_projecting_a_few_rows_at_a_time_gives_the_same_search(monkeypatch, n_models):
    """The vocabulary projection runs in blocks of rows on CPU so that a batch's (rows, V)
    logits never exist at once; blocks of 3 rows must find what one block finds. Scores agree
    to float tolerance, not bit for bit: BLAS picks its kernel by the number of rows, and on
    some CPUs (AMD Zen 4) a 3-row product sums in another order than a 20-row one."""
    import nmt.inference.beam_search as search

    vocab = 30
    models = [_model(vocab, seed=20 + i) for i in range(n_models)]
    src = _batch([6, 2, 9, 4, 7], vocab, seed=22)
    cfg = SearchConfig(beam=4, nbest=3, max_len_b=12)
    monkeypatch.setattr(search, "LOGIT_BLOCK_ELEMENTS", 10**9)
    whole = beam_search(models, src, cfg)
    monkeypatch.setattr(search, "LOGIT_BLOCK_ELEMENTS", 3 * vocab)
    blocks = beam_search(models, src, cfg)
    assert [[h.tokens for h in hyps] for hyps in blocks] == [[h.tokens for h in hyps] for hyps in whole]
    for got, want in zip(blocks, whole):
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
