"""The output-saving layer norm: nn.LayerNorm's numbers, without keeping its input."""

from __future__ import annotations

import torch

from nmt.ops.output_saving_layer_norm import MIN_ABS_GAMMA, OutputSavingLayerNorm


def _run(norm: torch.nn.LayerNorm, x: torch.Tensor, g: torch.Tensor):
    x = x.clone().requires_grad_(True)
    norm.zero_grad(set_to_none=True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = norm(x)
    y.backward(g)
    keeps_input = any(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in kept)
    return y.detach(), x.grad, norm.weight.grad, norm.bias.grad, keeps_input


def _pair(gamma_low: float):
    torch.manual_seed(0)
    norm = OutputSavingLayerNorm(48)
    with torch.no_grad():
        norm.weight.uniform_(gamma_low, 1.5)
        norm.bias.normal_()
    plain = torch.nn.LayerNorm(48)
    plain.load_state_dict(norm.state_dict())
    return norm, plain


def test_fp32_training_gets_layer_norm_s_numbers_without_keeping_the_input():
    norm, plain = _pair(0.5)
    x, g = torch.randn(3, 70, 48) * 3 + 1, torch.randn(3, 70, 48)
    y, gx, gw, gb, keeps = _run(norm, x, g)
    ry, rgx, rgw, rgb, rkeeps = _run(plain, x, g)
    assert rkeeps and not keeps
    assert torch.equal(y, ry)
    # x_hat is rebuilt from the output, so gradients agree to float rounding, not bit for bit.
    assert torch.allclose(gx, rgx, rtol=1e-4, atol=1e-5)
    assert torch.allclose(gw, rgw, rtol=1e-4, atol=1e-4) and torch.allclose(gb, rgb, rtol=1e-5, atol=1e-5)


def test_a_tiny_gamma_or_bf16_autocast_keeps_the_input_as_nn_layer_norm_does():
    norm, plain = _pair(0.5)
    with torch.no_grad():
        norm.weight[3] = MIN_ABS_GAMMA / 2  # (y - beta) / gamma would lose precision here
    plain.load_state_dict(norm.state_dict())
    x, g = torch.randn(5, 48), torch.randn(5, 48)
    y, gx, gw, gb, keeps = _run(norm, x, g)
    ry, rgx, rgw, rgb, _ = _run(plain, x, g)
    assert keeps and torch.equal(gx, rgx) and torch.equal(gw, rgw)
    norm, _ = _pair(0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _run(norm, x, g)[4]
