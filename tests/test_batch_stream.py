"""The batch stream yields what direct collation gives, in group order, prepared ahead by a thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from nmt.data.batch_stream import BatchStream
from nmt.data.batching import collate, make_batches
from nmt.data.token_arrays import TokenArray, TokenArrayWriter, split_paths


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    for lang in ("en", "de"):
        sizes = rng.integers(1, 30, 200)
        with TokenArrayWriter(*split_paths(tmp_path, "train", lang), np.dtype(np.uint16)) as w:
            w.add(rng.integers(4, 500, int(sizes.sum())), sizes)
    src, tgt = TokenArray(tmp_path, "train", "en", "uint16"), TokenArray(tmp_path, "train", "de", "uint16")
    batches = make_batches(src.sizes, tgt.sizes, np.arange(len(src)), 200, seed=1, epoch=1)
    groups = [batches[i : i + 3] for i in range(0, len(batches), 3)]  # 3 batches per update
    return src, tgt, groups


def _same(a, b) -> bool:
    return torch.equal(a.src, b.src) and torch.equal(a.prev, b.prev) and torch.equal(a.target, b.target)


def test_yields_every_group_from_start_in_order_as_direct_collation(corpus):
    src, tgt, groups = corpus
    with BatchStream(src, tgt, groups, start=2) as stream:
        got = list(stream)
    assert [u.position for u in got] == list(range(2, len(groups)))
    for u in got:
        expected = [collate(src, tgt, ids) for ids in groups[u.position]]
        assert len(u.batches) == len(expected) and all(_same(a, b) for a, b in zip(u.batches, expected))
        assert u.filler is None and u.micro_steps == len(expected)
        assert u.n_tgt_tokens == sum(b.n_tgt_tokens for b in expected)


def test_each_rank_takes_every_world_size_th_batch_and_a_filler_when_short(corpus):
    src, tgt, groups = corpus
    with BatchStream(src, tgt, groups, rank=1, world_size=2) as stream:
        update = next(stream)
    group = groups[0]  # 3 batches over 2 ranks: rank 1 trains on batch 1, then a zero-weight filler
    assert update.micro_steps == 2 and len(update.batches) == 1
    assert _same(update.batches[0], collate(src, tgt, group[1]))
    assert _same(update.filler, collate(src, tgt, group[0]))


def test_groups_are_collated_ahead_of_the_consumer(corpus):
    src, tgt, groups = corpus
    done = []

    def recording_collate(s, t, ids):
        done.append(len(ids))
        return collate(s, t, ids)

    with BatchStream(src, tgt, groups, depth=2, collate_fn=recording_collate) as stream:
        deadline = time.monotonic() + 10
        while len(done) < 2 * 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(done) >= 2 * 3  # two updates ready before the first was asked for
        time.sleep(0.1)
        assert len(done) <= 3 * 3  # and no more than depth (+ the one in hand) ahead


def test_a_collation_error_is_raised_in_the_consumer(corpus):
    src, tgt, groups = corpus
    bad = [groups[0], [np.array([10**6])]]
    with BatchStream(src, tgt, bad) as stream:
        next(stream)
        with pytest.raises(IndexError):
            next(stream)


def test_closing_early_stops_the_thread(corpus):
    src, tgt, groups = corpus
    before = threading.active_count()
    stream = BatchStream(src, tgt, groups, depth=1)
    next(stream)
    stream.close()
    assert not stream._thread.is_alive() and threading.active_count() == before
    assert list(stream) == []
