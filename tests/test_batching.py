"""Batches: the vectorised greedy cut equals the pair-by-pair rule; collation pads as the model expects."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nmt.data.batching import collate, make_batches, padded_sources, source_tensor
from nmt.data.token_arrays import TokenArrayWriter, TokenArray, split_paths
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def pair_by_pair_batches(src_sizes, tgt_sizes, indices, max_tokens, seed, epoch, max_sentences=None):
    """The rule written out one pair at a time (how nmt formed batches before vectorising)."""
    rng = np.random.default_rng([seed, epoch])
    idx = indices[rng.permutation(len(indices))]
    idx = idx[np.lexsort((src_sizes[idx], tgt_sizes[idx]))]
    batches, start, max_src, max_tgt = [], 0, 0, 0
    for i in range(len(idx)):
        s, t = src_sizes[idx[i]] + 1, tgt_sizes[idx[i]] + 1
        count = i - start + 1
        new_src, new_tgt = max(max_src, s), max(max_tgt, t)
        too_big = count * new_src > max_tokens or count * new_tgt > max_tokens
        too_many = max_sentences is not None and count > max_sentences
        if (too_big or too_many) and count > 1:
            batches.append(idx[start:i])
            start, max_src, max_tgt = i, s, t
        else:
            max_src, max_tgt = new_src, new_tgt
    if start < len(idx):
        batches.append(idx[start:])
    return [batches[j] for j in rng.permutation(len(batches))]


@pytest.mark.parametrize("trial", range(40))
def test_batches_equal_the_pair_by_pair_rule_for_the_same_seed_and_epoch(trial):
    rng = np.random.default_rng(trial)
    n = int(rng.integers(0, 300))
    high = 5 if trial % 3 == 0 else 120  # many ties, or a wide spread
    src, tgt = rng.integers(0, high, n), rng.integers(0, high, n)
    indices = np.flatnonzero(rng.random(n) < 0.9)
    max_tokens = int(rng.choice([1, 40, 100, 300, 1000, 4096]))  # 1 and 40: pairs longer than a batch
    max_sentences = None if trial % 2 else int(rng.integers(1, 20))
    mine = make_batches(src, tgt, indices, max_tokens, seed=trial, epoch=3, max_sentences=max_sentences)
    rule = pair_by_pair_batches(src, tgt, indices, max_tokens, trial, 3, max_sentences)
    assert len(mine) == len(rule)
    assert all(np.array_equal(a, b) for a, b in zip(mine, rule))


def test_collate_pads_sources_with_eos_and_shifts_targets_behind_bos(tmp_path):
    for lang, sents in (("en", [[5, 6, 7], [8], []]), ("de", [[9, 10], [11, 12, 13, 14], [15]])):
        with TokenArrayWriter(*split_paths(tmp_path, "train", lang), np.dtype(np.uint16)) as w:
            w.add(np.array([t for s in sents for t in s]), np.array([len(s) for s in sents]))
    src, tgt = TokenArray(tmp_path, "train", "en", "uint16"), TokenArray(tmp_path, "train", "de", "uint16")
    b = collate(src, tgt, np.array([2, 0, 1]))
    P, E, B = PAD_ID, EOS_ID, BOS_ID
    assert torch.equal(b.src, torch.tensor([[E, P, P, P], [5, 6, 7, E], [8, E, P, P]]))
    assert torch.equal(b.prev, torch.tensor([[B, 15, P, P, P], [B, 9, 10, P, P], [B, 11, 12, 13, 14]]))
    assert torch.equal(b.target, torch.tensor([[15, E, P, P, P], [9, 10, E, P, P], [11, 12, 13, 14, E]]))
    assert (b.n_src_tokens, b.n_tgt_tokens, b.n_sentences) == (1 + 4 + 2, 2 + 3 + 5, 3)


@pytest.mark.parametrize("len_multiple,batch_multiple", [(8, 1), (8, 8), (16, 4)])
def test_required_multiples_bound_the_shapes_keep_the_token_budget_and_every_pair(len_multiple, batch_multiple):
    rng = np.random.default_rng(7)
    n = 2000
    src, tgt = rng.integers(0, 60, n), rng.integers(0, 60, n)
    indices = np.arange(n)
    batches = make_batches(src, tgt, indices, 1024, seed=1, epoch=1, len_multiple=len_multiple, batch_multiple=batch_multiple)
    assert np.array_equal(np.sort(np.concatenate(batches)), indices)  # every pair once
    for ids in batches:
        width_src = -(-(int(src[ids].max()) + 1) // len_multiple) * len_multiple
        width_tgt = -(-(int(tgt[ids].max()) + 1) // len_multiple) * len_multiple
        assert len(ids) * max(width_src, width_tgt) <= 1024 or len(ids) == 1  # padding counts in the budget
        assert len(ids) < batch_multiple or len(ids) % batch_multiple == 0
    plain = make_batches(src, tgt, indices, 1024, seed=1, epoch=1)
    shapes = lambda bs, m: {(len(b), -(-(int(src[b].max()) + 1) // m), -(-(int(tgt[b].max()) + 1) // m)) for b in bs}
    assert len(shapes(batches, len_multiple)) < 0.7 * len(shapes(plain, 1))


def test_collate_pads_widths_to_the_required_multiple_without_counting_the_padding(tmp_path):
    for lang, sents in (("en", [[5, 6, 7], [8]]), ("de", [[9], [11, 12, 13, 14, 15, 16, 17, 18]])):
        with TokenArrayWriter(*split_paths(tmp_path, "train", lang), np.dtype(np.uint16)) as w:
            w.add(np.array([t for s in sents for t in s]), np.array([len(s) for s in sents]))
    src, tgt = TokenArray(tmp_path, "train", "en", "uint16"), TokenArray(tmp_path, "train", "de", "uint16")
    plain, padded = collate(src, tgt, np.array([0, 1])), collate(src, tgt, np.array([0, 1]), len_multiple=8)
    assert padded.src.shape == (2, 8) and padded.prev.shape == (2, 16) and padded.target.shape == (2, 16)
    assert torch.equal(padded.src[:, : plain.src.size(1)], plain.src) and bool((padded.src[:, plain.src.size(1):] == PAD_ID).all())
    assert torch.equal(padded.target[:, : plain.target.size(1)], plain.target)
    assert (padded.n_src_tokens, padded.n_tgt_tokens) == (plain.n_src_tokens, plain.n_tgt_tokens)


def test_every_source_is_padded_alike_from_a_token_array_or_from_lists(tmp_path):
    """Training batches, validation BLEU and translation lay out the encoder's input with one
    function (`padded_sources`): each sentence, then eos, right-padded to the longest + 1."""
    sents = [[5, 6, 7], [8], [], [9, 10]]
    with TokenArrayWriter(*split_paths(tmp_path, "train", "en"), np.dtype(np.uint16)) as w:
        w.add(np.array([t for s in sents for t in s]), np.array([len(s) for s in sents]))
    src = TokenArray(tmp_path, "train", "en", "uint16")
    ids = np.array([0, 3, 1])
    from_array, lens = padded_sources(src, ids)
    P, E = PAD_ID, EOS_ID
    assert from_array.tolist() == [[5, 6, 7, E], [9, 10, E, P], [8, E, P, P]] and lens.tolist() == [3, 2, 1]
    from_lists = source_tensor([sents[i] for i in ids])
    assert from_lists.dtype == torch.long and from_lists.tolist() == from_array.tolist()
    assert torch.equal(collate(src, src, ids).src, from_lists)
    assert padded_sources(src, ids, multiple=8)[0].shape == (3, 8)
