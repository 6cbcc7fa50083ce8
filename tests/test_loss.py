"""The paper's label-smoothed loss (the reference) and the fused projected loss of nmt.ops that training uses, against it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.ops import projected_loss as loss_module
from nmt.train.loss import label_smoothed_nll_loss


def written_out_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Section 5.4 written out: (1 - eps) * NLL + eps / K * sum_k -log p_k, from log_softmax."""
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)
    loss = (1.0 - epsilon) * nll + (epsilon / lprobs.size(-1)) * -lprobs.sum(-1)
    return loss.sum(), nll.sum().detach()


def _loss_and_grad(fn, logits: torch.Tensor, target: torch.Tensor, epsilon: float, scale: float = 1.0):
    x = logits.detach().clone().requires_grad_(True)
    loss, nll = fn(x, target, epsilon)
    (loss * scale).backward()
    return loss.detach(), nll, x.grad


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_the_reference_loss_is_the_papers_label_smoothing_written_out(epsilon):
    """F.cross_entropy's label smoothing is Szegedy et al.'s q' over all K classes, as the paper cites."""
    torch.manual_seed(0)
    logits = torch.randn(37, 101) * 4
    target = torch.randint(0, 101, (37,))
    mine = _loss_and_grad(label_smoothed_nll_loss, logits, target, epsilon, scale=0.37)
    ref = _loss_and_grad(written_out_loss, logits, target, epsilon, scale=0.37)
    assert mine[0].dtype == mine[1].dtype == torch.float32
    assert torch.allclose(mine[0], ref[0], rtol=1e-6)
    assert torch.allclose(mine[1], ref[1], rtol=1e-6)
    assert torch.allclose(mine[2], ref[2], rtol=1e-5, atol=1e-7)
    assert not mine[1].requires_grad


def test_bf16_logits_are_scored_in_fp32_and_empty_input_gives_zero():
    logits = torch.randn(8, 30).bfloat16()
    target = torch.randint(0, 30, (8,))
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    assert torch.allclose(loss, written_out_loss(logits.float(), target, 0.1)[0], rtol=1e-6)
    empty = torch.zeros(0, 30, requires_grad=True)
    loss, nll = label_smoothed_nll_loss(empty, torch.zeros(0, dtype=torch.long), 0.1)
    assert loss.item() == nll.item() == 0.0


def _projected_and_reference(hidden, weight, target, epsilon, dtype, scale=0.37):
    """Loss, NLL and the hidden and weight gradients, by the projected loss and by the
    reference formulation on logits materialised with F.linear (under autocast for bf16)."""
    out = []
    for projected in (True, False):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            if projected:
                loss, nll = label_smoothed_nll_loss(loss_module.ProjectedLogits(h, w, dtype), target, epsilon)
            else:
                loss, nll = label_smoothed_nll_loss(F.linear(h, w), target, epsilon)  # the reference
        (loss * scale).backward()
        out.append((loss.detach(), nll, h.grad, w.grad))
    return out


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_the_projected_loss_equals_projecting_then_the_log_softmax_formulation_in_fp32(epsilon, monkeypatch):
    torch.manual_seed(0)
    hidden, weight = torch.randn(37, 16), torch.randn(101, 16) * 0.5
    target = torch.randint(0, 101, (37,))
    monkeypatch.setattr(loss_module, "PROJECTED_CHUNK_ELEMENTS", 5 * 101)  # several chunks and a ragged last one
    (loss, nll, gh, gw), (rloss, rnll, rgh, rgw) = _projected_and_reference(hidden, weight, target, epsilon, torch.float32)
    assert loss.dtype == nll.dtype == torch.float32 and not nll.requires_grad
    assert torch.allclose(loss, rloss, rtol=1e-6) and torch.allclose(nll, rnll, rtol=1e-6)
    assert torch.allclose(gh, rgh, rtol=1e-5, atol=1e-7)
    assert torch.allclose(gw, rgw, rtol=1e-5, atol=1e-7)


def test_the_projected_loss_under_bf16_matches_autocast_within_bf16_rounding(monkeypatch):
    torch.manual_seed(0)
    hidden, weight = torch.randn(64, 32), torch.randn(500, 32) * 0.3
    target = torch.randint(0, 500, (64,))
    monkeypatch.setattr(loss_module, "PROJECTED_CHUNK_ELEMENTS", 7 * 500)
    (loss, nll, gh, gw), (rloss, rnll, rgh, rgw) = _projected_and_reference(hidden, weight, target, 0.1, torch.bfloat16)
    assert gh.dtype == gw.dtype == torch.float32
    assert torch.allclose(loss, rloss, rtol=1e-6) and torch.allclose(nll, rnll, rtol=1e-6)  # same bf16 logits
    assert torch.allclose(gh, rgh, rtol=1e-2, atol=1e-2 * rgh.abs().max().item())
    assert torch.allclose(gw, rgw, rtol=1e-2, atol=1e-2 * rgw.abs().max().item())


def test_the_projected_loss_without_gradients_gives_the_same_sums():
    torch.manual_seed(0)
    hidden, weight = torch.randn(9, 8, requires_grad=True), torch.randn(30, 8, requires_grad=True)
    target = torch.randint(0, 30, (9,))
    logits = loss_module.ProjectedLogits(hidden, weight, torch.float32)
    with torch.no_grad():
        quiet = label_smoothed_nll_loss(logits, target, 0.1)
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1)
    assert quiet[0].item() == loss.item() and quiet[1].item() == nll.item()
    assert not quiet[0].requires_grad
