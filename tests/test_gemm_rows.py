"""bf16 training on CPU pads its products' rows to a bucket: same numbers, one shape per update."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.ops import projected_loss as loss_module
from nmt.train.distributed import DistContext
from nmt.train.engine import TrainEngine
from nmt.ops.bucketed_linear import BucketedLinear
from nmt.train.loss import ProjectedLogits, label_smoothed_nll_loss
from nmt.model.transformer import FeedForward
from nmt.ops.attention import cpu_attention as attend
from nmt.ops.bucketed_linear import BucketedLinear
from nmt.ops.feed_forward import CpuFeedForward
from nmt.model.config import build_config
from test_engine import make_batch  # tests/ is on pytest's path


def _linear_and_grads(lin: torch.nn.Linear, x: torch.Tensor, g: torch.Tensor, bf16: bool):
    x = x.clone().requires_grad_(True)
    lin.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = lin(x)
    (y.float() * g).sum().backward()
    return y.detach(), x.grad, lin.weight.grad, lin.bias.grad


@pytest.mark.parametrize("shape", [(3, 7), (5, 16), (1, 1)])
def test_bucketed_linear_under_bf16_gives_autocast_s_output_and_gradients(shape):
    torch.manual_seed(0)
    bucketed = BucketedLinear(24, 40)
    plain = torch.nn.Linear(24, 40)
    plain.load_state_dict(bucketed.state_dict())
    bucketed.row_multiple = 64  # 21, 80 and 1 rows padded to 64 or 128
    x, g = torch.randn(*shape, 24), torch.randn(*shape, 40)
    y, gx, gw, gb = _linear_and_grads(bucketed, x, g, bf16=True)
    ry, rgx, rgw, rgb = _linear_and_grads(plain, x, g, bf16=True)
    assert y.dtype == ry.dtype == torch.bfloat16 and y.shape == ry.shape
    assert torch.equal(y, ry)  # the zero rows change no product
    assert torch.equal(gx, rgx) and torch.equal(gw, rgw) and torch.equal(gb, rgb)


def test_bucketed_linear_is_nn_linear_in_fp32_and_without_gradients():
    torch.manual_seed(0)
    lin = BucketedLinear(8, 6)
    lin.row_multiple = 64
    x = torch.randn(5, 8)
    assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(lin(x), F.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16()))


def test_the_projected_loss_pads_short_chunks_without_changing_loss_or_gradients(monkeypatch):
    torch.manual_seed(0)
    hidden, weight = torch.randn(37, 16), torch.randn(101, 16) * 0.5
    target = torch.randint(0, 101, (37,))
    monkeypatch.setattr(loss_module, "PROJECTED_CHUNK_ELEMENTS", 10 * 101)  # chunks of 10 rows, the last of 7
    out = []
    for bucket in (0, 64):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        loss, nll = label_smoothed_nll_loss(ProjectedLogits(h.bfloat16(), w, torch.bfloat16, bucket), target, 0.1)
        loss.backward()
        out.append((loss.detach(), nll, h.grad, w.grad))
    (loss, nll, gh, gw), (ploss, pnll, pgh, pgw) = out
    assert torch.equal(loss, ploss) and torch.equal(nll, pnll)
    assert torch.equal(gh, pgh) and torch.allclose(gw, pgw, rtol=1e-6, atol=1e-6)


def test_bf16_training_on_cpu_multiplies_one_set_of_shapes_whatever_the_batch():
    """oneDNN builds a kernel per new bf16 product shape (milliseconds each): batches of other
    sizes must not bring new shapes, or every update pays for them again."""
    e = TrainEngine(build_config("tiny", 40, 40, dropout=0.0), DistContext(0, 1, 0, torch.device("cpu")),
                    amp="bf16", seed=7, gemm_row_multiple=64)

    def product_shapes(batch) -> set[str]:
        with torch.profiler.profile(record_shapes=True) as prof:
            e.step([(batch, 1.0)], lr=1e-3)
        return {str(ev.input_shapes) for ev in prof.key_averages(group_by_input_shape=True)
                if ev.key in ("aten::mm", "aten::addmm") and ev.input_shapes and ev.input_shapes[0]}

    first = product_shapes(make_batch(1, n=3, src_len=5, tgt_len=4))
    second = product_shapes(make_batch(2, n=4, src_len=7, tgt_len=6))
    assert first and first == second


def _ffn_and_grads(ffn, x: torch.Tensor, g: torch.Tensor):
    x = x.clone().requires_grad_(True)
    ffn.zero_grad(set_to_none=True)
    saved = []
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t) or t, lambda t: t):
        y = ffn(x)
    (y.float() * g).sum().backward()
    d_ff = ffn.fc1.out_features
    wide = {t.untyped_storage().data_ptr() for t in saved if t.size(-1) == d_ff and t.numel() >= x.size(0) * x.size(1) * d_ff}
    return y.detach(), x.grad, ffn.fc1.weight.grad, ffn.fc2.weight.grad, len(wide)


def test_bucketed_feed_forward_keeps_one_wide_activation_and_autocast_s_numbers():
    """The (rows x d_ff) activation stays padded from fc1 to fc2: kept once for the backward
    (ReLU's and fc2's), where copying it into fc2's own padded buffer kept it twice."""
    torch.manual_seed(0)
    bucketed, plain = FeedForward(16, 64, 0.0), FeedForward(16, 64, 0.0)  # plain: the stock op
    plain.load_state_dict(bucketed.state_dict())
    bucketed.__class__ = CpuFeedForward  # as nmt.ops.optimize_for makes it
    for lin in (bucketed.fc1, bucketed.fc2):
        lin.__class__ = BucketedLinear
        lin.row_multiple = 32  # 3 x 7 = 21 rows padded to 32
    x, g = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    y, gx, gw1, gw2, wide = _ffn_and_grads(bucketed, x, g)
    ry, rgx, rgw1, rgw2, _ = _ffn_and_grads(plain, x, g)
    assert torch.equal(y, ry)
    assert torch.equal(gx, rgx) and torch.equal(gw1, rgw1) and torch.equal(gw2, rgw2)
    assert wide == 1


def test_cpu_bf16_attention_keeps_q_k_v_in_bf16_for_the_backward_with_the_same_gradients():
    """Attention runs in fp32 on CPU; its fp32 copies of q, k, v are not kept for the backward
    (cast again there from the bf16 inputs), and the gradients are unchanged."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8).bfloat16().requires_grad_(True) for _ in range(3))
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    out = attend(q, k, v, attn_mask=mask)
    node = out.grad_fn.next_functions[0][0]  # the attention's own backward, behind the cast to bf16
    assert node._saved_query.dtype == torch.float32
    assert node._saved_query.data_ptr() != node._saved_query.data_ptr()  # made anew on each use, not kept
    g = torch.randn(out.shape)
    grads = torch.autograd.grad((out.float() * g).sum(), (q, k, v))
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q2.float(), k2.float(), v2.float(), attn_mask=mask).to(torch.bfloat16)
    assert torch.equal(out, ref)
    ref_grads = torch.autograd.grad((ref.float() * g).sum(), (q2, k2, v2))
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
