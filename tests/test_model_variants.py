"""The model's non-paper variants (issue #32: Marian / OPUS-MT models): the feed-forward
activation, the layout of the sinusoids and a pre-softmax bias. Each default is the paper's,
and a checkpoint written before the fields existed loads to it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.errors import NmtError
from nmt.model.config import TransformerConfig, architecture, build_config
from nmt.model.transformer import FeedForward, Transformer, sinusoidal_positions
from nmt.ops import optimize_for
from nmt.ops.projected_loss import ProjectedLogits
from nmt.train.loss import label_smoothed_nll_loss

VOCAB = 40
VARIANTS = [
    {},
    {"activation": "swish"},
    {"activation": "gelu"},
    {"positions_layout": "halves"},
    {"output_bias": True},
    {"activation": "swish", "positions_layout": "halves", "output_bias": True, "pre_ln": True},
]


def _tiny(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(build_config("tiny", VOCAB, VOCAB, max_positions=32, **kw)).eval()
    if model.output_bias is not None:  # zero at initialisation: make it matter
        with torch.no_grad():
            model.output_bias.normal_(0.0, 1.0)
    return model


def _sources(n: int = 3, length: int = 7, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (n, length), generator=g)
    src[:, -1] = EOS_ID
    src[0, -2:] = torch.tensor([EOS_ID, PAD_ID])  # one shorter sentence
    return src


# -- activation ---------------------------------------------------------------------------
def test_swish_ffn_is_x_times_sigmoid_x_and_relu_is_the_default():
    torch.manual_seed(0)
    swish = FeedForward(8, 16, 0.0, "swish")
    relu = FeedForward(8, 16, 0.0)
    relu.load_state_dict(swish.state_dict())
    x = torch.randn(5, 8)
    h = swish.fc1(x)
    torch.testing.assert_close(swish(x), swish.fc2(h * torch.sigmoid(h)))
    torch.testing.assert_close(relu(x), relu.fc2(h.clamp(min=0)), rtol=0, atol=0)
    assert TransformerConfig().activation == "relu"
    assert all(layer.ffn.activation == "relu" for layer in _tiny().decoder_layers)


@pytest.mark.parametrize("activation", ["relu", "swish"])
def test_the_cpu_feed_forward_keeps_the_activation(activation):
    model = _tiny(activation=activation)
    src, prev = _sources(), _sources(seed=2)
    with torch.no_grad():
        stock = model(src, prev)
        fast = optimize_for(model, torch.device("cpu"))(src, prev)
    torch.testing.assert_close(fast, stock)


def test_an_unknown_activation_or_layout_is_one_line_naming_the_choices():
    with pytest.raises(NmtError, match=r"--activation 'tanh'; choose one of relu, swish, gelu$"):
        build_config("tiny", VOCAB, VOCAB, activation="tanh")
    with pytest.raises(NmtError, match=r"--positions-layout 'concat'; choose one of interleaved, halves$"):
        build_config("tiny", VOCAB, VOCAB, positions_layout="concat")


# -- positions ----------------------------------------------------------------------------
def test_interleaved_is_the_papers_table_bit_for_bit():
    n, d = 50, 64
    pe = torch.zeros(n, d, dtype=torch.float64)
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            pe[pos, 2 * i], pe[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    table = sinusoidal_positions(n, d)
    torch.testing.assert_close(table, pe.float(), rtol=0, atol=1e-6)
    # the default is the table nmt built before the layouts existed, bit for bit
    pos = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    before = torch.zeros(n, d, dtype=torch.float64)
    before[:, 0::2], before[:, 1::2] = torch.sin(pos * inv_freq), torch.cos(pos * inv_freq)
    assert torch.equal(table, before.float())
    assert torch.equal(_tiny().positions, sinusoidal_positions(32, 64))


@pytest.mark.parametrize("d", [64, 7])
def test_halves_is_marians_table(d):
    """Hugging Face's MarianSinusoidalPositionalEmbedding, written out: position_enc[pos, j] =
    pos / 10000^(2 (j // 2) / d); sines of the even j, then cosines of the odd j."""
    import numpy as np

    n = 50
    position_enc = np.array([[pos / np.power(10000, 2 * (j // 2) / d) for j in range(d)] for pos in range(n)])
    sentinel = d // 2 if d % 2 == 0 else d // 2 + 1
    out = np.zeros((n, d))
    out[:, :sentinel] = np.sin(position_enc[:, 0::2])
    out[:, sentinel:] = np.cos(position_enc[:, 1::2])
    torch.testing.assert_close(sinusoidal_positions(n, d, "halves"), torch.from_numpy(out).float(), rtol=0, atol=1e-6)
    assert torch.equal(_tiny(positions_layout="halves").positions, sinusoidal_positions(32, 64, "halves"))


# -- output bias --------------------------------------------------------------------------
def test_output_bias_shifts_the_logits_by_exactly_the_bias():
    with_bias = _tiny(output_bias=True)
    without = _tiny()
    without.load_state_dict({k: v for k, v in with_bias.state_dict().items() if k != "output_bias"})
    assert tuple(with_bias.output_bias.shape) == (VOCAB,) and without.output_bias is None
    assert "output_bias" not in without.state_dict()  # old checkpoints keep their keys
    assert torch.count_nonzero(Transformer(build_config("tiny", VOCAB, VOCAB, output_bias=True)).output_bias) == 0
    src, prev = _sources(), _sources(seed=2)
    prev[:, 0] = BOS_ID
    with torch.no_grad():
        torch.testing.assert_close(with_bias(src, prev), without(src, prev) + with_bias.output_bias)
        state_b = with_bias.init_decoder_state(with_bias.encode(src))
        state_n = without.init_decoder_state(without.encode(src))
        step_b = with_bias.decode_step(prev[:, 0], state_b)
        step_n = without.decode_step(prev[:, 0], state_n)
    torch.testing.assert_close(step_b, step_n + with_bias.output_bias)


def test_the_projected_training_loss_includes_the_bias_and_its_gradient():
    torch.manual_seed(0)
    hidden = torch.randn(11, 16, requires_grad=True)
    weight = torch.randn(VOCAB, 16, requires_grad=True)
    bias = torch.randn(VOCAB, requires_grad=True)
    target = torch.randint(0, VOCAB, (11,))
    loss, nll = label_smoothed_nll_loss(ProjectedLogits(hidden, weight, torch.float32, 0, bias), target, 0.1)
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    ref = F.cross_entropy(hidden @ weight.t() + bias, target, label_smoothing=0.1, reduction="sum")
    ref_grads = torch.autograd.grad(ref, (hidden, weight, bias))
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, F.cross_entropy(hidden @ weight.t() + bias, target, reduction="sum").detach())
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


def test_training_s_loss_is_the_cross_entropy_of_the_biased_logits_and_trains_the_bias():
    from nmt.data.batching import Batch
    from nmt.train.engine import forward_loss
    from nmt.train.precision import Precision

    model = _tiny(output_bias=True).train()
    for module in model.modules():  # dropout off: the same numbers twice
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    src, target = _sources(), _sources(length=6, seed=3)
    prev = torch.cat([torch.full((3, 1), BOS_ID), target[:, :-1]], dim=1)
    batch = Batch(src, prev, target, int(src.ne(PAD_ID).sum()), int(target.ne(PAD_ID).sum()))
    loss, _ = forward_loss(model, batch, 0.1, Precision.create("none", torch.device("cpu")))
    (grad,) = torch.autograd.grad(loss, model.output_bias)
    ref = F.cross_entropy(model(src, prev).flatten(0, 1), target.flatten(), ignore_index=PAD_ID, label_smoothing=0.1,
                          reduction="sum")
    (ref_grad,) = torch.autograd.grad(ref, model.output_bias)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)
    assert grad.abs().sum() > 0


# -- every variant: teacher forcing equals incremental decoding ------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "+".join(f"{k}={v[k]}" for k in v) or "paper")
def test_incremental_decoding_equals_the_teacher_forced_forward(variant):
    model = _tiny(**variant)
    src, tgt = _sources(), _sources(length=6, seed=3)
    prev = torch.cat([torch.full((3, 1), BOS_ID), tgt[:, :-1]], dim=1)
    with torch.no_grad():
        forced = F.log_softmax(model(src, prev), dim=-1)
        state = model.init_decoder_state(model.encode(src))
        steps = torch.stack([F.log_softmax(model.decode_step(prev[:, t], state), dim=-1) for t in range(prev.size(1))], 1)
    torch.testing.assert_close(steps, forced, rtol=0, atol=1e-5)


# -- old checkpoints ------------------------------------------------------------------------
def test_a_config_written_before_the_fields_loads_to_the_papers_choices():
    old = build_config("tiny", VOCAB, VOCAB).to_dict()
    for name in ("activation", "positions_layout", "output_bias"):
        del old[name]
    cfg = TransformerConfig.from_dict(old)
    assert (cfg.activation, cfg.positions_layout, cfg.output_bias) == ("relu", "interleaved", False)
    assert cfg == build_config("tiny", VOCAB, VOCAB)
    # resume and averaging compare architectures: an old record is the same model as the defaults
    assert architecture(old) == architecture(cfg.to_dict())
    assert architecture(old) != architecture(build_config("tiny", VOCAB, VOCAB, activation="swish").to_dict())


def test_the_new_fields_are_architecture_fields_of_nmt_train():
    from nmt.train.resume import ARCHITECTURE_FIELDS

    assert {"activation", "positions_layout", "output_bias"} <= set(ARCHITECTURE_FIELDS)
    assert {"activation", "positions_layout", "output_bias"} <= set(architecture(TransformerConfig().to_dict()))


# -- CTranslate2 export ---------------------------------------------------------------------
def _greedy(model: Transformer, src: torch.Tensor, steps: int) -> list[list[int]]:
    with torch.no_grad():
        state = model.init_decoder_state(model.encode(src))
        tokens = torch.full((src.size(0),), BOS_ID)
        out: list[list[int]] = [[] for _ in range(src.size(0))]
        for _ in range(steps):
            tokens = model.decode_step(tokens, state).argmax(-1)
            for row, t in enumerate(tokens.tolist()):
                if not out[row] or out[row][-1] != EOS_ID:
                    out[row].append(t)
    return [seq[:-1] if seq[-1] == EOS_ID else seq for seq in out]


@pytest.mark.parametrize("variant", [{"activation": "swish", "positions_layout": "halves", "output_bias": True},
                                     {"activation": "gelu"}], ids=["swish+halves+bias", "gelu"])
def test_ctranslate2_scores_and_greedy_equal_nmts(variant, tmp_path):
    """The export carries the activation, the table of either layout and the bias: CTranslate2's
    log-probability of every token of random targets is nmt's, and its greedy search nmt's."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from nmt.export.ctranslate2 import _fill_spec

    model = _tiny(seed=5, **variant)
    tokens = ["<pad>", "<unk>", "<s>", "</s>", *(f"t{i}" for i in range(4, VOCAB))]
    spec = _fill_spec(model, tokens, tokens)

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    translator = ctranslate2.Translator(Converter().convert(str(tmp_path / "model")), intra_threads=1)
    g = torch.Generator().manual_seed(7)
    sources = [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (3, 5, 8, 6)]
    targets = [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (4, 2, 9, 6)]
    pieces = lambda ids: [tokens[i] for i in ids]
    scored = translator.score_batch([pieces(s) for s in sources], [pieces(t) for t in targets])
    for src, tgt, got in zip(sources, targets, scored):
        prev = torch.tensor([[BOS_ID, *tgt]])
        with torch.no_grad():
            lprobs = F.log_softmax(model(torch.tensor([[*src, EOS_ID]]), prev), dim=-1)[0]
        want = lprobs.gather(-1, torch.tensor([*tgt, EOS_ID])[:, None]).squeeze(1)
        assert got.log_probs == pytest.approx(want.tolist(), abs=1e-4)  # eos included
    steps = 12
    for ids in sources:
        want = _greedy(model, torch.tensor([[*ids, EOS_ID]]), steps)[0]
        got = translator.translate_batch([pieces(ids)], beam_size=1, max_decoding_length=steps)[0]
        assert [tokens.index(p) for p in got.hypotheses[0]] == want
