"""fp32 CPU inference decodes with the packed step (nmt.ops.cpu_decoder_step), over packed caches
or, where its C++ loop builds, over caches read through ancestor tables (nmt.ops.ancestor_attention):
the stock step's numbers at every step, the stock model's translations, and the stock step wherever
it does not apply."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from nmt.data.tokenizer import BOS_ID
from nmt.inference.beam_search import SearchConfig, beam_search
from nmt.model.config import build_config
from nmt.model.incremental import SelfAttentionCache
from nmt.model.transformer import Transformer
from nmt.ops import optimize_for
from nmt.ops.ancestor_attention import AncestorSelfAttentionCache
from nmt.ops.native import DISABLE_ENV, native_module
from nmt.ops.cpu_decoder_step import PackedSelfAttentionCache
from test_beam_search import _batch  # tests/ is on pytest's path

VOCAB = 24
VARIANTS = {
    "paper": {},
    "pre-LN, swish, logits bias, Marian positions": dict(pre_ln=True, activation="swish", output_bias=True,
                                                        positions_layout="halves"),
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _cache_type(state) -> type:
    return type(state.caches[0])


@pytest.fixture(params=["packed", "ancestor"])
def fast_cache(request, monkeypatch) -> type:
    """The cache fp32 CPU inference decodes with: the packed one (NMT_NATIVE_KERNELS=0, or no
    compiler), or the C++ loop's where it builds."""
    if request.param == "packed":
        monkeypatch.setenv(DISABLE_ENV, "0")
        return PackedSelfAttentionCache
    if native_module() is None:
        pytest.skip("the C++ decoder kernels cannot be built here (no C++ compiler or ninja)")
    return AncestorSelfAttentionCache


def _models(seed: int, **kw) -> tuple[Transformer, Transformer]:
    """(stock, optimized for CPU inference): the same weights."""
    torch.manual_seed(seed)
    stock = Transformer(build_config("tiny", VOCAB, VOCAB, **kw)).eval()
    if stock.output_bias is not None:
        torch.nn.init.normal_(stock.output_bias)
    fast = optimize_for(copy.deepcopy(stock), torch.device("cpu"), torch.float32, inference=True).eval()
    return stock, fast


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lengths", [[5, 9, 3, 7], [6, 6, 6, 6]], ids=["padded", "no padding"])
def test_packed_step_gives_the_stock_logits_through_reorders_growth_and_sentences_leaving(variant, lengths, fast_cache):
    stock, fast = _models(seed=3, **VARIANTS[variant])
    src = _batch(lengths, VOCAB, seed=4)
    g = torch.Generator().manual_seed(5)
    beam = 3
    with torch.inference_mode():
        states = [m.init_decoder_state(m.encode(src), beam=beam) for m in (stock, fast)]
        assert _cache_type(states[0]) is SelfAttentionCache and _cache_type(states[1]) is fast_cache
        n_sent, rows = len(lengths), len(lengths)  # the first step runs one row per sentence
        tokens = torch.full((rows,), BOS_ID)
        for step in range(20):  # past the cache's capacities 8, 12 and 18, and an ancestor cache's compaction
            want, got = (m.decode_step(tokens, s) for m, s in zip((stock, fast), states))
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            # sentences leave (indices among the live ones); the others continue from random rows of theirs
            leaving = {10: [0, 2, 3], 14: [1, 2], 17: [1]}.get(step)
            sentences = torch.tensor(leaving) if leaving else None
            kept = sentences.tolist() if sentences is not None else range(n_sent)
            width = rows // n_sent
            parents = [s * width + int(torch.randint(width, (1,), generator=g)) for s in kept for _ in range(beam)]
            n_sent, rows = len(kept), len(kept) * beam
            for s in states:
                s.reorder(torch.tensor(parents), sentences)
            tokens = torch.randint(4, VOCAB, (rows,), generator=g)
            if fast_cache is AncestorSelfAttentionCache:  # left sentences stay until fewer than half are live
                held = states[1].memory_kv[0][1].size(0)
                assert held == (1 if step >= 17 else 4) and states[1].sentences.numel() == n_sent


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("search", [dict(), dict(beam_style="fairseq", lenpen_style="avg", nbest=2),
                                    dict(beam_style="shrink", beam=3)], ids=["t2t", "fairseq n-best", "shrink"])
def test_searches_with_the_packed_step_find_the_stock_model_s_translations(variant, search, fast_cache):
    stock, fast = _models(seed=6, **VARIANTS[variant])
    src = _batch([7, 4, 9, 2, 5], VOCAB, seed=7)
    cfg = SearchConfig(**{"beam": 4, "max_len_b": 12, **search})
    prefixes = [[5, 6], [], [7], [], [8, 9, 10]]
    for kw in ({}, {"prefixes": prefixes}):
        want, got = beam_search(stock, src, cfg, **kw), beam_search(fast, src, cfg, **kw)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps], abs=1e-4)


def test_the_stock_step_runs_wherever_the_packed_one_does_not_apply(fast_cache):
    """Autograd (scoring with gradients, training), bf16 weights and a model in training mode keep
    the stock state and step; fp32 inference takes the packed one."""
    _, fast = _models(seed=8)
    src = _batch([4, 6], VOCAB, seed=9)
    with torch.no_grad():
        assert _cache_type(fast.init_decoder_state(fast.encode(src))) is fast_cache
        # a cache asked for is the one used, and the step follows it
        state = fast.init_decoder_state(fast.encode(src), cache=SelfAttentionCache)
        assert _cache_type(state) is SelfAttentionCache
        fast.decode_step(torch.full((2,), 2, dtype=torch.long), state)
        assert state.caches[0].length == 1
    assert _cache_type(fast.init_decoder_state(fast.encode(src))) is SelfAttentionCache  # autograd on
    with torch.no_grad():
        fast.train()
        assert _cache_type(fast.init_decoder_state(fast.encode(src))) is SelfAttentionCache
        fast.eval()
        half = copy.deepcopy(fast).to(torch.bfloat16)
        assert _cache_type(half.init_decoder_state(half.encode(src))) is SelfAttentionCache
        logits = half.decode_step(torch.full((2,), BOS_ID), half.init_decoder_state(half.encode(src)))
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_packed_state_holds_every_step_once_per_row_after_reorders(fast_cache):
    """The cache holds exactly the keys the stock caches hold, layer by layer, after a reorder
    that repeats and drops rows (an ancestor cache: read through its table)."""
    stock, fast = _models(seed=10)
    src = _batch([5, 3], VOCAB, seed=11)
    with torch.inference_mode():
        states = [m.init_decoder_state(m.encode(src), beam=2) for m in (stock, fast)]
        for tokens, parents in ((torch.tensor([BOS_ID, BOS_ID]), [0, 0, 1, 1]), (torch.tensor([4, 5, 6, 7]), [1, 1, 3, 2])):
            for m, s in zip((stock, fast), states):
                m.decode_step(tokens, s)
                s.reorder(torch.tensor(parents))
        for cache, packed in zip(*(s.caches for s in states)):
            if fast_cache is AncestorSelfAttentionCache:  # steps[s][anc[r, s]], each (rows of step s, 2, h, d_head)
                anc = packed.anc[: packed.rows, : packed.length].long()
                kv = torch.stack([step[anc[:, s]] for s, step in enumerate(packed.steps)], 1)  # (rows, steps, 2, h, d_head)
                k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            else:
                k = packed.kv[0, : packed.rows, :, : packed.length]
                v = packed.kv[1, : packed.rows, :, : packed.length]
            torch.testing.assert_close(k, cache.k[: cache.rows, :, : cache.length])
            torch.testing.assert_close(v, cache.v[: cache.rows, :, : cache.length])


def test_sampling_and_scoring_paths_accept_the_packed_state(fast_cache):
    """Sampling calls decode_step without reorders: the cache grows on its own."""
    _, fast = _models(seed=12)
    src = _batch([4, 8, 6], VOCAB, seed=13)
    with torch.inference_mode():
        state = fast.init_decoder_state(fast.encode(src))
        tokens = torch.full((3,), BOS_ID)
        for _ in range(15):
            logits = fast.decode_step(tokens, state)
            tokens = F.log_softmax(logits, -1).argmax(-1)
        if fast_cache is AncestorSelfAttentionCache:
            assert all(cache.length == 15 and len(cache.steps) == 15 and cache.anc.size(1) >= 15 for cache in state.caches)
        else:
            assert all(cache.length == 15 and cache.kv.size(3) >= 15 for cache in state.caches)
