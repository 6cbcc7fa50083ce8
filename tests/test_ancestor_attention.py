"""The C++ decoder self-attention over unreordered caches (nmt.ops.ancestor_attention) against the
stock op it replaces: scaled dot-product attention over the keys gathered into row order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.ops import ancestor_attention as aa
from nmt.ops import fused_vocabulary_top, native
from nmt.model.incremental import SelfAttentionCache

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def built():
    if native.native_module() is None:
        pytest.skip("the C++ decoder kernels cannot be built here (no C++ compiler or ninja)")


@pytest.mark.parametrize("heads, d_head", [(4, 32), (2, 64), (3, 5)])
@pytest.mark.parametrize("steps", [1, 7, 23])
def test_the_loop_equals_sdpa_over_the_keys_its_ancestor_table_names(built, heads, d_head, steps):
    g = torch.Generator().manual_seed(steps * 100 + d_head)
    rows, held, capacity = 11, 17, steps + 3
    kv = torch.randn(capacity, held, 2, heads, d_head, generator=g)
    anc = torch.randint(0, held, (rows, capacity), generator=g, dtype=torch.int32)
    q = torch.randn(rows, heads, d_head, generator=g)
    got = aa.ancestor_attention(q, list(kv.unbind(0)), anc, steps)  # step s: kv[s], (held, 2, h, d_head)
    gathered = kv[torch.arange(steps)[None, :], anc[:, :steps].long()]  # (rows, steps, 2, h, d_head)
    k, v = (gathered[:, :, i].transpose(1, 2) for i in (0, 1))  # (rows, h, steps, d_head)
    want = F.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_cache_attends_as_a_reordered_one_through_fan_out_growth_rows_leaving_and_compaction(built):
    """The beam search's pattern: one row per sentence, then k per sentence; sentences leave
    until fewer than half the rows held are live (the cache compacts); past the capacities."""
    g = torch.Generator().manual_seed(1)
    heads, d_head, beam = 2, 8, 3
    ancestor, stock = aa.AncestorSelfAttentionCache(), SelfAttentionCache()
    sentences = 6
    rows = sentences
    compacted = False
    for step in range(30):
        q = torch.randn(rows, heads, d_head, generator=g)
        kv = torch.randn(rows, 2, heads, d_head, generator=g)
        k, v = stock.append(kv[:, 0, :, None], kv[:, 1, :, None])  # (rows, h, 1, d_head) each
        want = F.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]
        torch.testing.assert_close(ancestor.attend(q, kv), want, rtol=1e-5, atol=1e-5)
        if step in (8, 14, 20) and sentences > 1:
            sentences -= 2 if sentences > 2 else 1
        width = rows // max(1, rows // beam) if step else 1
        parents = [s * width + int(torch.randint(width, (1,), generator=g)) for s in range(sentences) for _ in range(beam)]
        held = ancestor.held
        rows = len(parents)
        stock.reorder(torch.tensor(parents), None)
        ancestor.reorder(torch.tensor(parents), None)
        compacted |= ancestor.held < held
    assert compacted and max(kv.size(0) for kv in ancestor.steps) <= 2 * rows  # never more than twice the live rows once they shrink


def test_without_a_compiler_decoding_takes_the_stock_step_and_says_so_once(monkeypatch, capsys, tmp_path):
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load_inline", no_compiler)
    monkeypatch.setattr(native, "_built", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no finished build to load
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)  # conftest sets it where nothing builds
    assert native.native_module() is None and native.native_module() is None
    err = capsys.readouterr().err
    assert err.count("cannot be built here (Ninja is required to load C++ extensions") == 1

    from ops.test_native_decoder_step import _models
    from test_beam_search import _batch

    _, fast = _models(seed=2, path="auto")
    with torch.inference_mode():
        state = fast.init_decoder_state(fast.encode(_batch([4, 6], 24, seed=3)))
    assert type(state.caches[0]) is SelfAttentionCache
    assert fused_vocabulary_top(fast) is None  # the search ranks with its PyTorch operations too


def test_nmt_native_kernels_0_keeps_the_stock_step(monkeypatch):
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    assert native.native_module() is None


@pytest.mark.parametrize("per_sentence", [1, 2, 3, 4, 5])  # the C++ loop attends up to 4 rows of a sentence together
@pytest.mark.parametrize("masked", [False, True], ids=["no padding", "padded"])
@pytest.mark.parametrize("d_head, src_len", [(16, 9), (32, 16), (32, 37), (64, 5)])
def test_the_source_loop_equals_the_encoder_decoder_attention_by_products(built, per_sentence, masked, d_head, src_len):
    from nmt.ops.product_attention import attention_by_products

    g = torch.Generator().manual_seed(per_sentence + src_len)
    held, heads = 5, 4
    live = torch.tensor([4, 0, 3])  # the sentences still searched: entries of the keys and values held
    k, v = (torch.randn(held, heads, src_len, d_head, generator=g) for _ in range(2))
    q = torch.randn(len(live) * per_sentence, heads, d_head, generator=g)
    lengths = torch.tensor([src_len, 3, 1, src_len - 2, 2])
    mask = (torch.arange(src_len)[None, :] < lengths[:, None])[:, None, None, :] if masked else None
    k_t = aa.transposed_source_keys(k)  # (N, h, d_head, src_len padded to a multiple of 16)
    assert k_t.size(3) % aa.SOURCE_LANES == 0 and torch.equal(k_t[..., :src_len], k.transpose(2, 3))
    got = aa.source_attention(q, k_t, v, mask, live)
    by_sentence = q.view(len(live), per_sentence, heads, d_head).transpose(1, 2)  # (N, h, beam, d_head)
    want = attention_by_products(by_sentence, k[live], v[live], None if mask is None else mask[live]).transpose(1, 2).reshape(q.shape)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_source_loop_split_between_threads_mid_sentence_equals_the_products(built):
    """Two threads cut the rows into chunks that need not start at a sentence: the rows of a
    sentence attended together stop at the chunk's end."""
    from nmt.ops.product_attention import attention_by_products

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(9)
        n_sent, per_sentence, heads, d_head, src_len = 13, 5, 2, 32, 11
        k, v = (torch.randn(n_sent, heads, src_len, d_head, generator=g) for _ in range(2))
        q = torch.randn(n_sent * per_sentence, heads, d_head, generator=g)
        got = aa.source_attention(q, aa.transposed_source_keys(k), v, None, torch.arange(n_sent))
        by_sentence = q.view(n_sent, per_sentence, heads, d_head).transpose(1, 2)
        want = attention_by_products(by_sentence, k, v, None).transpose(1, 2).reshape(q.shape)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(before)
