"""fp32 CPU inference decodes on one of two paths (nmt.ops.optimize_for): native, nmt's C++ step
(nmt.ops.native_decoder_step) over caches read through ancestor tables (nmt.ops.ancestor_attention),
where the kernels build; or stock, the model's own step. Either gives the stock model's numbers at
every step and its translations, and the stock step runs wherever the native one does not apply."""

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
from nmt.errors import NmtError
from nmt.ops import decoder_path, fused_vocabulary_top, optimize_for
from nmt.ops.ancestor_attention import AncestorSelfAttentionCache
from nmt.ops.native import DISABLE_ENV, native_module
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


@pytest.fixture(params=["stock", "native"])
def path(request) -> str:
    """The decoding path asked of `optimize_for`; native only where the kernels build."""
    if request.param == "native" and native_module() is None:
        pytest.skip("the C++ decoder kernels cannot be built here (no C++ compiler or ninja)")
    return request.param


def _cache_of(path: str) -> type:
    return AncestorSelfAttentionCache if path == "native" else SelfAttentionCache


def _models(seed: int, path: str = "native", **kw) -> tuple[Transformer, Transformer]:
    """(stock, optimized for CPU inference on `path`): the same weights."""
    torch.manual_seed(seed)
    stock = Transformer(build_config("tiny", VOCAB, VOCAB, **kw)).eval()
    if stock.output_bias is not None:
        torch.nn.init.normal_(stock.output_bias)
    fast = optimize_for(copy.deepcopy(stock), torch.device("cpu"), torch.float32, inference=True, decoder=path).eval()
    assert path == "auto" or decoder_path(fast) == path
    return stock, fast


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lengths", [[5, 9, 3, 7], [6, 6, 6, 6]], ids=["padded", "no padding"])
def test_each_path_gives_the_stock_logits_through_reorders_growth_and_sentences_leaving(variant, lengths, path):
    stock, fast = _models(seed=3, path=path, **VARIANTS[variant])
    src = _batch(lengths, VOCAB, seed=4)
    g = torch.Generator().manual_seed(5)
    beam = 3
    with torch.inference_mode():
        states = [m.init_decoder_state(m.encode(src), beam=beam) for m in (stock, fast)]
        assert _cache_type(states[0]) is SelfAttentionCache and _cache_type(states[1]) is _cache_of(path)
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
            if path == "native":  # left sentences stay until fewer than half are live
                held = states[1].memory_kv[0][1].size(0)
                assert held == (1 if step >= 17 else 4) and states[1].sentences.numel() == n_sent


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("search", [dict(), dict(beam_style="fairseq", lenpen_style="avg", nbest=2),
                                    dict(beam_style="shrink", beam=3)], ids=["t2t", "fairseq n-best", "shrink"])
def test_searches_on_each_path_find_the_stock_model_s_translations(variant, search, path):
    stock, fast = _models(seed=6, path=path, **VARIANTS[variant])
    src = _batch([7, 4, 9, 2, 5], VOCAB, seed=7)
    cfg = SearchConfig(**{"beam": 4, "max_len_b": 12, **search})
    prefixes = [[5, 6], [], [7], [], [8, 9, 10]]
    for kw in ({}, {"prefixes": prefixes}):
        want, got = beam_search(stock, src, cfg, **kw), beam_search(fast, src, cfg, **kw)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps], abs=1e-4)


def test_the_stock_step_runs_wherever_the_native_one_does_not_apply(path):
    """Autograd (scoring with gradients, training), bf16 weights and a model in training mode keep
    the stock state and step; fp32 inference takes its path's."""
    _, fast = _models(seed=8, path=path)
    src = _batch([4, 6], VOCAB, seed=9)
    with torch.no_grad():
        assert _cache_type(fast.init_decoder_state(fast.encode(src))) is _cache_of(path)
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


def test_the_ancestor_cache_holds_every_step_once_per_row_after_reorders(path):
    """The native path's caches hold exactly the keys the stock caches hold, layer by layer, after
    a reorder that repeats and drops rows (read through their ancestor tables)."""
    if path != "native":
        pytest.skip("the stock path's caches are the stock caches")
    stock, fast = _models(seed=10)
    src = _batch([5, 3], VOCAB, seed=11)
    with torch.inference_mode():
        states = [m.init_decoder_state(m.encode(src), beam=2) for m in (stock, fast)]
        for tokens, parents in ((torch.tensor([BOS_ID, BOS_ID]), [0, 0, 1, 1]), (torch.tensor([4, 5, 6, 7]), [1, 1, 3, 2])):
            for m, s in zip((stock, fast), states):
                m.decode_step(tokens, s)
                s.reorder(torch.tensor(parents))
        for cache, ancestor in zip(*(s.caches for s in states)):
            anc = ancestor.anc[: ancestor.rows, : ancestor.length].long()  # steps[s][anc[r, s]]: (rows of step s, 2, h, d_head)
            kv = torch.stack([step[anc[:, s]] for s, step in enumerate(ancestor.steps)], 1)  # (rows, steps, 2, h, d_head)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            torch.testing.assert_close(k, cache.k[: cache.rows, :, : cache.length])
            torch.testing.assert_close(v, cache.v[: cache.rows, :, : cache.length])


def test_sampling_and_scoring_accept_either_paths_state(path):
    """Sampling calls decode_step without reorders: the cache grows on its own."""
    _, fast = _models(seed=12, path=path)
    src = _batch([4, 8, 6], VOCAB, seed=13)
    with torch.inference_mode():
        state = fast.init_decoder_state(fast.encode(src))
        tokens = torch.full((3,), BOS_ID)
        for _ in range(15):
            logits = fast.decode_step(tokens, state)
            tokens = F.log_softmax(logits, -1).argmax(-1)
        if path == "native":
            assert all(cache.length == 15 and len(cache.steps) == 15 and cache.anc.size(1) >= 15 for cache in state.caches)
        else:
            assert all(cache.length == 15 for cache in state.caches)


def test_the_path_is_chosen_once_and_only_fp32_cpu_inference_loads_the_kernels(monkeypatch):
    """auto takes native where the kernels load (NMT_NATIVE_KERNELS=0: stock); native where they
    cannot is a one-line error; training and other dtypes decode with the stock step, and only
    the native path ranks with the C++ vocabulary loop."""
    stock_model, _ = _models(seed=14, path="stock")
    for dtype, inference in ((torch.float32, False), (torch.bfloat16, True)):
        model = optimize_for(copy.deepcopy(stock_model), torch.device("cpu"), dtype, inference=inference)
        assert decoder_path(model) == "stock" and fused_vocabulary_top(model) is None
    assert decoder_path(stock_model) == "stock"
    monkeypatch.setenv(DISABLE_ENV, "0")
    assert decoder_path(optimize_for(copy.deepcopy(stock_model), torch.device("cpu"), torch.float32, inference=True)) == "stock"
    with pytest.raises(NmtError, match="--decoder native needs nmt's C.. kernels"):
        optimize_for(copy.deepcopy(stock_model), torch.device("cpu"), torch.float32, inference=True, decoder="native")
    monkeypatch.delenv(DISABLE_ENV)
    if native_module() is not None:
        native = optimize_for(copy.deepcopy(stock_model), torch.device("cpu"), torch.float32, inference=True)
        assert decoder_path(native) == "native" and fused_vocabulary_top(native) is not None
