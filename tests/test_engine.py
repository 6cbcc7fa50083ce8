"""The training engine in-process: one update from given batches, with no clock, file or log."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch

from nmt.data.batching import Batch
from nmt.train.distributed import DistContext
from nmt.train.engine import SkippedStep, StepStats, TrainEngine, forward_loss, target_positions
from nmt.model.config import build_config


def make_batch(seed: int, n: int = 3, src_len: int = 5, tgt_len: int = 4, vocab: int = 40) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (n, src_len), generator=g)
    target = torch.randint(4, vocab, (n, tgt_len), generator=g)
    target[0, -1] = 0  # one padded position
    prev = torch.cat([torch.full((n, 1), 1), target[:, :-1]], dim=1)
    return Batch(src, prev, target, int(src.numel()), int(target.ne(0).sum()))


def engine(world: int = 1, rank: int = 0, **kw) -> TrainEngine:
    cfg = build_config("tiny", 40, 40, dropout=0.0)
    ctx = DistContext(rank, world, 0, torch.device("cpu"))
    return TrainEngine(cfg, ctx, seed=7, label_smoothing=0.1, **kw)


class PretendTwoRanks(DistContext):
    """A rank whose twin holds the very same batches: sums double, DDP would average equal grads."""

    def all_reduce_sum(self, t):
        return t * 2

    def wrap(self, model):
        return model

    def no_sync(self, model):
        return nullcontext()


def params(e: TrainEngine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in e.model.state_dict().items()}


def test_an_update_is_the_token_weighted_mean_gradient_over_its_micro_batches():
    a, b = make_batch(1), make_batch(2, n=2, src_len=7, tgt_len=6)
    e = engine()
    reference = copy.deepcopy(e.model)
    out = e.step([(a, 1.0), (b, 1.0)], lr=1e-3)
    assert isinstance(out, StepStats)
    assert out.ntokens == a.n_tgt_tokens + b.n_tgt_tokens and out.nsentences == 5

    # the same update by hand: sum of token losses over both batches / all target tokens, one Adam step
    from nmt.train.precision import Precision

    p = Precision.create("none", torch.device("cpu"))
    opt = torch.optim.Adam(reference.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    total = sum(forward_loss(reference, x, 0.1, p)[0] for x in (a, b)) / out.ntokens
    total.backward()
    opt.step()
    for name, value in reference.state_dict().items():
        assert torch.allclose(value, e.model.state_dict()[name], atol=1e-6), name
    assert out.loss_sum == pytest.approx(total.item() * out.ntokens, rel=1e-5)


def test_a_dummy_micro_batch_keeps_collectives_in_step_without_changing_the_update():
    a = make_batch(3)
    plain, padded = engine(), engine()
    plain.step([(a, 1.0)], lr=1e-3)
    out = padded.step([(a, 1.0), (make_batch(4), 0.0)], lr=1e-3)
    assert out.ntokens == a.n_tgt_tokens
    for name, value in params(plain).items():
        assert torch.allclose(value, params(padded)[name], atol=1e-7), name


def test_gradients_are_normalised_by_the_tokens_of_all_ranks():
    """Two ranks with equal batches take exactly the step one rank takes alone."""
    a = make_batch(5)
    alone = engine()
    twin = TrainEngine(build_config("tiny", 40, 40, dropout=0.0), PretendTwoRanks(0, 2, 0, torch.device("cpu")),
                       seed=7, label_smoothing=0.1)
    alone_out = alone.step([(a, 1.0)], lr=1e-3)
    twin_out = twin.step([(a, 1.0)], lr=1e-3)
    assert twin_out.ntokens == 2 * alone_out.ntokens
    for name, value in params(alone).items():
        assert torch.allclose(value, params(twin)[name], atol=1e-7), name


def test_a_non_finite_loss_skips_the_update_and_leaves_model_and_optimizer_untouched(monkeypatch):
    import nmt.train.engine as engine_module

    e = engine()
    e.step([(make_batch(6), 1.0)], lr=1e-3)
    before, opt_before = params(e), copy.deepcopy(e.optimizer.state_dict())
    real = engine_module.label_smoothed_nll_loss
    monkeypatch.setattr(engine_module, "label_smoothed_nll_loss",
                        lambda logits, target, eps: tuple(x * float("nan") for x in real(logits, target, eps)))
    out = e.step([(make_batch(7), 1.0)], lr=1e-3)
    assert isinstance(out, SkippedStep) and out.gnorm != out.gnorm  # NaN
    for name, value in before.items():
        assert torch.equal(value, params(e)[name]), name
    assert e.optimizer.state_dict()["state"][0]["step"] == opt_before["state"][0]["step"]
    assert all(p.grad is None for p in e.model.parameters())


def test_the_loss_is_summed_in_fp32_under_bf16_autocast():
    e = engine(amp="bf16")
    loss, nll = forward_loss(e.model, make_batch(8), 0.1, e.precision)
    assert loss.dtype == nll.dtype == torch.float32
    assert isinstance(e.step([(make_batch(8), 1.0)], lr=1e-3), StepStats)


def test_the_loss_reads_exactly_the_non_pad_targets_in_order():
    """The positions come from the batch's own token count (no device round trip) and must
    pick what `target != pad` picks: padding inside the batch at several rows."""
    from nmt.train.loss import label_smoothed_nll_loss

    e = engine()
    batch = make_batch(9, n=4, tgt_len=6)
    batch.target[2, 3:] = 0
    batch.n_tgt_tokens = int(batch.target.ne(0).sum())
    mask = batch.target.ne(0)
    assert torch.equal(target_positions(batch), mask.flatten().nonzero().squeeze(1))
    hidden = e.model.decode_hidden(batch.prev, e.model.encode(batch.src))
    expected = label_smoothed_nll_loss(hidden[mask] @ e.model.output_weight.t(), batch.target[mask], 0.1)
    got = forward_loss(e.model, batch, 0.1, e.precision)
    assert torch.allclose(got[0], expected[0], rtol=1e-6) and torch.allclose(got[1], expected[1], rtol=1e-6)
