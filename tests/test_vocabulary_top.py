"""The C++ vocabulary step (nmt.ops.vocabulary_top) against the PyTorch operations it replaces:
log_softmax over the row, pad and bos masked, topk, eos's column."""

from __future__ import annotations

import copy

import pytest
import torch

from nmt.inference.beam_search import SearchConfig, beam_search
from nmt.model.config import SpecialIds, build_config
from nmt.model.transformer import Transformer
from nmt.ops import fused_vocabulary_top, native, optimize_for
from nmt.ops.vocabulary_top import vocabulary_top
from test_beam_search import _batch  # tests/ is on pytest's path

pytestmark = pytest.mark.usefixtures("one_thread")

NMT_IDS = SpecialIds()  # pad 0, unk 1, bos 2, eos 3
MARIAN_IDS = SpecialIds(pad=31, unk=1, bos=31, eos=0)  # an imported Marian vocabulary of 32


@pytest.fixture
def built():
    if native.native_module() is None:
        pytest.skip("the C++ decoder kernels cannot be built here (no C++ compiler or ninja)")


def _stock(logits: torch.Tensor, w: int, ids: SpecialIds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores = torch.log_softmax(logits, dim=-1)
    eos = scores[:, ids.eos].clone()
    scores[:, [ids.pad, ids.bos]] = float("-inf")
    values, tokens = scores.topk(w, dim=1)
    return values, tokens, eos


def _fused(logits: torch.Tensor, w: int, ids: SpecialIds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values, tokens, eos = torch.empty(logits.size(0), w), torch.empty(logits.size(0), w, dtype=torch.long), torch.empty(logits.size(0))
    vocabulary_top(logits, values, tokens, eos, ids)
    return values, tokens, eos


@pytest.mark.parametrize("vocab, w", [(8000, 8), (8000, 1), (8003, 4), (1000, 8), (200, 8), (32, 8), (32, 30), (5, 3)])
@pytest.mark.parametrize("ids", [NMT_IDS, MARIAN_IDS], ids=["nmt ids", "Marian ids"])
def test_the_loop_gives_log_softmax_s_best_tokens_and_eos(built, vocab, w, ids):
    if max(ids) >= vocab or w > vocab - 2:
        pytest.skip("ids outside this vocabulary")
    g = torch.Generator().manual_seed(vocab + w)
    logits = torch.randn(37, vocab, generator=g) * 4
    logits[3, ids.pad] = logits[4, ids.bos] = 50.0  # the row's largest logit: in the normalizer, never ranked
    got, want = _fused(logits.clone(), w, ids), _stock(logits, w, ids)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-5)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=2e-5)
    assert not torch.isin(got[1], torch.tensor([ids.pad, ids.bos])).any()


def test_ties_go_to_the_lower_id_and_a_row_of_equal_logits_gives_uniform_log_probs(built):
    logits = torch.zeros(2, 300)
    logits[1, [40, 7, 250, 130]] = 2.0
    values, tokens, eos = _fused(logits, 6, NMT_IDS)
    assert tokens[0].tolist() == [1, 3, 4, 5, 6, 7]  # pad 0 and bos 2 left out
    torch.testing.assert_close(values[0], torch.full((6,), -torch.log(torch.tensor(300.0)).item()))
    assert tokens[1].tolist() == [7, 40, 130, 250, 1, 3]
    torch.testing.assert_close(eos, torch.log_softmax(logits, 1)[:, NMT_IDS.eos])


def test_it_writes_into_row_slices_of_the_search_s_buffers(built):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(10, 500, generator=g)
    values, tokens, eos = torch.full((30, 8), 7.0), torch.full((30, 8), -1, dtype=torch.long), torch.full((30,), 7.0)
    vocabulary_top(logits, values[10:20], tokens[10:20], eos[10:20], NMT_IDS)
    want = _stock(logits, 8, NMT_IDS)
    torch.testing.assert_close(values[10:20], want[0], rtol=0, atol=2e-5)
    assert torch.equal(tokens[10:20], want[1])
    assert (values[:10] == 7).all() and (values[20:] == 7).all() and (tokens[20:] == -1).all() and (eos[20:] == 7).all()


@pytest.mark.parametrize("style", ["t2t", "fairseq", "shrink"])
def test_a_model_s_search_finds_the_same_translations_with_the_loop_as_without(built, monkeypatch, style):
    torch.manual_seed(4)
    stock = Transformer(build_config("tiny", 300, 300)).eval()
    fast = optimize_for(copy.deepcopy(stock), torch.device("cpu"), torch.float32, inference=True).eval()
    assert fused_vocabulary_top(fast) is not None and fused_vocabulary_top(stock) is None
    src = _batch([9, 4, 12, 7, 2], 300, seed=6)
    cfg = SearchConfig(beam=4, beam_style=style, lenpen_style="avg" if style == "fairseq" else "gnmt", nbest=3)
    with_loop = beam_search(fast, src, cfg)
    monkeypatch.setattr(fast, "decoder_path", "stock")  # the same model on the stock path: PyTorch step and ranking
    assert fused_vocabulary_top(fast) is None
    without = beam_search(fast, src, cfg)
    assert [[h.tokens for h in hyps] for hyps in with_loop] == [[h.tokens for h in hyps] for hyps in without]
    for a, b in zip(with_loop, without):
        torch.testing.assert_close(torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]), rtol=0, atol=1e-5)
