"""The C++ "Add & Norm" of a sublayer's output (nmt.ops.add_and_norm) against the PyTorch
operations it replaces: the bias, the residual sum, `F.layer_norm`; and the bias with ReLU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.ops import native
from nmt.ops.add_and_norm import add_and_norm, bias_relu

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def built():
    if native.native_module() is None:
        pytest.skip("the C++ decoder kernels cannot be built here (no C++ compiler or ninja)")


def _tensors(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.nn.LayerNorm]:
    g = torch.Generator().manual_seed(seed)
    y, x = torch.randn(rows, width, generator=g) * 3, torch.randn(rows, width, generator=g) + 1
    norm = torch.nn.LayerNorm(width, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_(generator=g)
        norm.bias.normal_(generator=g)
    return y, x, torch.randn(width, generator=g), norm


@pytest.mark.parametrize("rows, width", [(1, 8), (37, 128), (300, 512), (5, 100)])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
def test_post_ln_add_and_norm_is_layer_norm_of_the_residual_sum(built, rows, width, with_bias):
    y, x, bias, norm = _tensors(rows, width, seed=rows + width)
    want = F.layer_norm(x + y + (bias if with_bias else 0), (width,), norm.weight, norm.bias, norm.eps)
    with torch.no_grad():
        got = add_and_norm(y, bias if with_bias else None, x, norm)
    assert got.data_ptr() == y.data_ptr()  # in place, over the product's output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pre_ln_add_is_the_residual_sum_alone(built):
    y, x, bias, _ = _tensors(20, 64, seed=3)
    want = x + y + bias
    torch.testing.assert_close(add_and_norm(y, bias, x, None), want, rtol=1e-6, atol=1e-6)


def test_bias_relu_is_relu_of_the_biased_product(built):
    y, _, bias, _ = _tensors(50, 256, seed=4)
    want = F.relu(y + bias)
    got = bias_relu(y, bias)
    assert got.data_ptr() == y.data_ptr()
    assert torch.equal(got, want)


def test_wrong_shapes_are_refused_not_read_past(built):
    y, x, bias, norm = _tensors(4, 16, seed=5)
    with pytest.raises(RuntimeError, match="bias"):
        add_and_norm(y, bias[:8], x, norm)
    with pytest.raises(RuntimeError, match="x"):
        add_and_norm(y, bias, x[:3], norm)
