"""The model and the recipe's pieces equal the paper's formulas."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import run_nmt
from nmt.train.loss import label_smoothed_nll_loss
from nmt.model.transformer import Transformer
from nmt.model.config import build_config
from nmt.train.schedule import cooldown, learning_rate, paper_lr, peak_lr
from nmt.data.tokenizer import BOS_ID, EOS_ID


def test_schedule_equals_the_papers_values():
    assert paper_lr(1, 512, 4000) == pytest.approx(1.747e-07, rel=1e-3)
    assert paper_lr(4000, 512, 4000) == pytest.approx(6.988e-04, rel=1e-3)
    assert paper_lr(100000, 512, 4000) == pytest.approx(1.398e-04, rel=1e-3)


def test_fairseq_peak_form_peaks_at_warmup_and_decays_as_inverse_sqrt():
    assert peak_lr(4000, 1e-3, 4000) == pytest.approx(1e-3)
    assert peak_lr(2000, 1e-3, 4000) == pytest.approx(5e-4)
    assert peak_lr(16000, 1e-3, 4000) == pytest.approx(5e-4)
    assert learning_rate(10, 512, 4000, lr_scale=2.0) == pytest.approx(2 * paper_lr(10, 512, 4000))


def test_cooldown_factor():
    assert [cooldown(p, 0.25) for p in (0.0, 0.5, 0.75, 0.875, 1.0, 1.2)] == pytest.approx([1, 1, 1, 0.5, 0, 0])
    assert cooldown(0.99, 0.0) == 1.0


def test_archs_parameter_counts_match_the_paper():
    out = run_nmt("archs", "--vocab-size", "37000").stdout
    counts = {m.group(1): float(m.group(2)) for m in re.finditer(r"(tiny|small|base|big)\s.*?([\d.]+)M", out)}
    assert counts["base"] == pytest.approx(63, rel=0.02)
    assert counts["big"] == pytest.approx(214, rel=0.02)


def test_unknown_arch_lists_the_known_ones():
    from nmt.errors import NmtError

    with pytest.raises(NmtError, match="tiny, mini, small, base, big"):
        build_config("huge", 100, 100)


def _tiny(vocab: int = 50, **kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(build_config("tiny", vocab, vocab, **kw)).eval()


def test_changing_the_last_target_token_leaves_earlier_outputs_bit_identical():
    model = _tiny()
    src = torch.randint(4, 50, (3, 9))
    prev = torch.randint(4, 50, (3, 7))
    prev[:, 0] = BOS_ID
    changed = prev.clone()
    changed[:, -1] = (prev[:, -1] + 1 - 4) % 46 + 4
    with torch.no_grad():
        a, b = model(src, prev), model(src, changed)
    assert torch.equal(a[:, :-1], b[:, :-1])
    assert not torch.equal(a[:, -1], b[:, -1])


def test_padding_does_not_change_a_sentences_outputs():
    model = _tiny()
    src = torch.randint(4, 50, (1, 6))
    prev = torch.tensor([[BOS_ID, 7, 8, 9]])
    padded_src = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(src, prev), model(padded_src, prev), atol=1e-5)


def test_shared_embeddings_are_one_matrix_scaled_by_sqrt_d_model():
    model = _tiny()
    assert model.src_embed.weight is model.tgt_embed.weight is model.output_weight
    assert model.embed_scale == pytest.approx(math.sqrt(model.cfg.d_model))
    separate = Transformer(build_config("tiny", 50, 60, share_all_embeddings=False))
    assert separate.src_embed.weight is not separate.tgt_embed.weight
    assert separate.output_weight is separate.tgt_embed.weight


def test_word_dropout_zeroes_whole_token_embeddings_at_rate_p_and_scales_the_rest():
    from nmt.model.transformer import word_dropout

    torch.manual_seed(0)
    x = torch.randn(64, 50, 16, requires_grad=True)
    y = word_dropout(x, 0.25, True)
    dropped = y.eq(0).all(-1)  # (64, 50): whole embeddings, never single dimensions
    assert torch.equal(y.eq(0), dropped[..., None].expand_as(y))
    assert dropped.float().mean().item() == pytest.approx(0.25, abs=0.02)
    assert torch.allclose(y[~dropped], x[~dropped] / 0.75)
    y.sum().backward()
    assert torch.equal(x.grad.eq(0).all(-1), dropped)
    assert torch.equal(word_dropout(x, 0.25, False), x) and torch.equal(word_dropout(x, 0.0, True), x)


def test_source_and_target_word_dropout_act_in_training_only_and_each_on_its_own_side():
    src = torch.randint(4, 50, (8, 9))
    prev = torch.randint(4, 50, (8, 7))
    plain = _tiny(dropout=0.0)  # the same weights as every model below: _tiny seeds before building
    with torch.no_grad():
        enc, dec = plain.encode(src), plain.decode_hidden(prev, plain.encode(src))
        assert torch.equal(plain(src, prev), _tiny(dropout=0.0, dropout_src=0.5, dropout_trg=0.5)(src, prev))  # eval: none
        for side in ("src", "trg"):
            model = _tiny(dropout=0.0, **{f"dropout_{side}": 0.5}).train()
            assert torch.equal(model.encode(src).states, enc.states) == (side == "trg")
            assert torch.equal(model.decode_hidden(prev, enc), dec) == (side == "src")


def test_label_smoothing_equals_a_hand_computation():
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    target = torch.tensor([0, 3])
    eps = 0.1
    loss, nll = label_smoothed_nll_loss(logits, target, eps)
    expected_loss = expected_nll = 0.0
    for row, gold in zip(logits.tolist(), target.tolist()):
        logz = math.log(sum(math.exp(x) for x in row))
        logp = [x - logz for x in row]
        q = [eps / 4 + (1 - eps) * (k == gold) for k in range(4)]  # Szegedy et al.: uniform over K
        expected_loss += -sum(qk * lp for qk, lp in zip(q, logp))
        expected_nll += -logp[gold]
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    assert nll.item() == pytest.approx(expected_nll, rel=1e-6)


def test_tiny_model_overfits_a_handful_of_pairs():
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", 20, 20, dropout=0.0))
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, 9, 10, EOS_ID], [11, 12, 13, EOS_ID], [14, 15, 16, EOS_ID]])
    tgt = src.flip(1)[:, 1:]  # reversed sentence...
    target = torch.cat([tgt, torch.full((4, 1), EOS_ID)], dim=1)  # ...then eos
    prev = torch.cat([torch.full((4, 1), BOS_ID), tgt], dim=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    for _ in range(150):
        logits = model(src, prev)
        loss, _ = label_smoothed_nll_loss(logits.reshape(-1, 20), target.reshape(-1), 0.0)
        opt.zero_grad()
        (loss / target.numel()).backward()
        opt.step()
    assert loss.item() / target.numel() < 0.02


def test_attention_by_products_equals_sdpa_with_a_padding_mask():
    """The encoder-decoder attention of CPU fp32 inference (beam queries grouped per sentence)
    gives SDPA's result, padded source positions masked."""
    from nmt.ops.product_attention import attention_by_products

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 6, 8), torch.randn(3, 4, 9, 8), torch.randn(3, 4, 9, 8)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 5:] = False
    for m in (mask, None):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
        torch.testing.assert_close(attention_by_products(q, k, v, m), want, rtol=1e-5, atol=1e-5)


def test_bf16_attention_on_cpu_is_computed_in_fp32_and_matches_sdpa():
    """CPU bf16 attention runs in fp32 (its bf16 backward is slow); same result as fp32 SDPA."""
    from nmt.ops.attention import cpu_attention as attend

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    ref = torch.nn.functional.scaled_dot_product_attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), attn_mask=mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), attn_mask=mask)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.bfloat16().float())
    # A query can arrive in fp32 beside bf16 keys and values (SDPA
    # refuses mixed dtypes): attended in fp32 all the same, the result in bf16.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = attend(q.bfloat16().float(), k.bfloat16(), v.bfloat16(), attn_mask=mask)
    assert mixed.dtype == torch.bfloat16
    torch.testing.assert_close(mixed.float(), ref.bfloat16().float())


def test_amp_auto_is_bf16_only_where_the_hardware_multiplies_bf16(monkeypatch):
    from nmt import device
    from nmt.train import precision
    cpu = torch.device("cpu")
    monkeypatch.setattr(device, "cpu_bf16_units", lambda: (False, "no units"))
    assert device.resolve_amp("auto", cpu, "train") == "none"
    assert precision.Precision.create("auto", cpu).dtype is None
    monkeypatch.setattr(device, "cpu_bf16_units", lambda: (True, "amx_bf16"))
    assert device.resolve_amp("auto", cpu, "train") == "bf16"
    assert device.resolve_amp("none", cpu, "train") == "none"


def test_amp_auto_translates_in_fp32_on_every_cpu_and_as_asked_otherwise(monkeypatch):
    from nmt import device
    from nmt.inference.checkpoints import resolve_dtype
    cpu = torch.device("cpu")
    monkeypatch.setattr(device, "cpu_bf16_units", lambda: (True, "amx_bf16"))
    assert device.resolve_amp("auto", cpu, "translate") == "none"
    assert resolve_dtype("auto", cpu) is torch.float32
    assert resolve_dtype("bf16", cpu) is torch.bfloat16 and resolve_dtype("fp16", cpu) is torch.float16
    with pytest.raises(ValueError):
        device.resolve_amp("auto", cpu, "serve")


def test_resolve_device_refuses_unknown_names_and_cuda_without_a_gpu():
    from nmt.device import resolve_device
    from nmt.errors import NmtError
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(NmtError, match=r"unknown --device 'gpu'; use auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        for name in ("cuda", "cuda:1"):
            with pytest.raises(NmtError, match=r"--device cuda was asked for, but PyTorch sees no GPU; use --device cpu"):
                resolve_device(name)


def test_cpu_dropout_keeps_one_minus_p_scales_the_kept_and_routes_the_gradient_through_the_same_mask():
    from nmt.ops.dropout import dropout

    x = torch.randn(1000, 1000, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.3, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.002  # 1M draws: standard deviation 0.0005
    assert torch.allclose(y[kept], x[kept] / 0.7)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, kept.float() / 0.7)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.3, training=True), y)  # the seed decides the mask
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0, training=True) is x


def test_the_cpu_dropout_mask_keeps_one_minus_p_in_each_16_bit_lane_and_follows_torchs_seed():
    from nmt.ops.dropout import keep_mask

    torch.manual_seed(5)
    keep = keep_mask(torch.Size([1001, 999]), 0.1).reshape(-1)  # not a multiple of 4: the last word is part used
    assert keep.shape == (1001 * 999,) and keep.dtype == torch.bool
    lanes = keep[: keep.numel() // 4 * 4].view(-1, 4).float()  # the four 16-bit lanes of each 64-bit word
    # 250k draws per lane: standard deviation 0.0006
    assert all(abs(m - 0.9) < 0.003 for m in lanes.mean(0).tolist())
    both = (lanes[:, 0] * lanes[:, 1]).mean().item()  # lanes of one word are independent
    assert abs(both - 0.81) < 0.004
    torch.manual_seed(5)
    assert torch.equal(keep_mask(torch.Size([1001, 999]), 0.1).reshape(-1), keep)
    assert not torch.equal(keep_mask(torch.Size([1001, 999]), 0.1).reshape(-1), keep)  # the next draw differs
    assert keep_mask(torch.Size([4096]), 1 - 2**-20).sum() <= 2  # p this close to 1 still fits the int16 threshold


def test_relu_dropout_on_cpu_equals_relu_then_dropout_with_the_same_random_state():
    from nmt.ops.dropout import dropout, relu_dropout

    x = torch.randn(64, 96)
    x[0, :8] = 0.0  # ReLU's kink: no gradient there either way
    results = []
    for fused in (True, False):
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(3)
        y = relu_dropout(xi, 0.3, True) if fused else dropout(torch.relu(xi), 0.3, True)
        (y * torch.arange(96.0)).sum().backward()
        results.append((y.detach(), xi.grad))
    (y, g), (ry, rg) = results
    assert torch.equal(y, ry) and torch.equal(g, rg)
    assert 0.45 < (y > 0).float().mean().item() / 0.7 < 0.55  # half positive, 70% of those kept
    assert torch.equal(relu_dropout(x, 0.3, False), torch.relu(x))


def _logits_and_grads(model, src, prev, bf16: bool):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(src, prev)
    logits.float().square().sum().backward()
    return [logits.float(), *(p.grad.clone() for p in model.parameters())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_optimize_for_cpu_keeps_the_parameters_and_the_stock_models_numbers(dtype):
    """The ops swapped in on CPU change classes, not parameters: the same checkpoint keys, and
    the stock model's logits and gradients: in fp32 to rounding (kernels sum in other orders),
    in bf16 as close to the fp32 numbers as the stock ops under autocast are."""
    from nmt.ops import optimize_for

    torch.manual_seed(0)
    cfg = build_config("tiny", 30, 30, dropout=0.0)
    stock, fast, exact = Transformer(cfg), Transformer(cfg), Transformer(cfg)
    fast.load_state_dict(stock.state_dict())
    exact.load_state_dict(stock.state_dict())
    optimize_for(fast, torch.device("cpu"), dtype, row_multiple=64)
    assert list(fast.state_dict()) == list(stock.state_dict())
    assert type(fast.encoder_layers[0].self_attn) is not type(stock.encoder_layers[0].self_attn)
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, 9, EOS_ID, 0]])  # one padded source
    prev = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 8, 0]])
    bf16 = dtype == torch.bfloat16
    ref = _logits_and_grads(exact, src, prev, bf16=False)
    if not bf16:
        for out, r in zip(_logits_and_grads(fast, src, prev, bf16=False), ref):
            torch.testing.assert_close(out, r, rtol=1e-4, atol=1e-5)
        return
    for out, base, r in zip(_logits_and_grads(fast, src, prev, True), _logits_and_grads(stock, src, prev, True), ref):
        error, stock_error = ((out - r).norm() / r.norm()).item(), ((base - r).norm() / r.norm()).item()
        assert error <= 1.25 * stock_error + 0.01, (error, stock_error)


@pytest.mark.parametrize("shape, bias", [((7, 32), True), ((5, 1, 32), True), ((3, 4, 32), False)])
def test_onednn_linear_is_f_linear_in_fp32_inference_and_keeps_gradients_otherwise(shape, bias):
    """The oneDNN product that fp32 inference takes on AMD CPUs equals F.linear to rounding;
    with gradients on it is nn.Linear itself, backward included."""
    from nmt.ops.onednn_linear import OneDnnLinear

    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 50, bias=bias)
    x = torch.randn(*shape)
    want = F.linear(x, layer.weight, layer.bias)
    layer.__class__ = OneDnnLinear  # as nmt.ops.optimize_for makes it
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    out = layer(x.requires_grad_())
    out.square().sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_inference_on_an_amd_cpu_takes_onednn_products_with_the_stock_models_search(monkeypatch):
    """optimize_for(inference=True) on an AMD CPU swaps in oneDNN products (layers and the
    vocabulary projection); beam search then finds the stock model's hypotheses."""
    import nmt.ops.onednn_linear as onednn
    from nmt.inference.beam_search import beam_search
    from nmt.inference.config import SearchConfig
    from nmt.ops import optimize_for

    monkeypatch.setattr(onednn, "cpu_vendor", lambda: "AuthenticAMD")
    torch.manual_seed(3)
    cfg = build_config("tiny", 40, 40, dropout=0.0)
    stock, fast = Transformer(cfg).eval(), Transformer(cfg)
    fast.load_state_dict(stock.state_dict())
    optimize_for(fast, torch.device("cpu"), torch.float32, inference=True).eval()
    assert type(fast.decoder_layers[0].ffn.fc1) is onednn.OneDnnLinear and fast.onednn_projection
    import nmt.ops.attention as attention

    calls = []  # the vocabulary projection's (CpuTransformer.project_fp32)
    monkeypatch.setattr(attention, "onednn_linear", lambda *a: calls.append(1) or onednn.onednn_linear(*a))
    src = torch.tensor([[5, 6, 7, 9, EOS_ID], [8, 9, 11, EOS_ID, 0]])
    search = SearchConfig(beam=4, nbest=2, max_len_b=10)
    want, got = beam_search(stock, src, search), beam_search(fast, src, search)
    assert calls, "the vocabulary projection did not take oneDNN"
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    for g, w in zip(got, want):
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-4)
    optimize_for(training := Transformer(cfg), torch.device("cpu"), torch.float32)
    assert type(training.decoder_layers[0].ffn.fc1) is not onednn.OneDnnLinear and not training.onednn_projection
