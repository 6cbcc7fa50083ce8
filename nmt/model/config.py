"""The model's configuration: every hyperparameter of the Transformer in one dataclass, and
the named architectures. No torch here, so the CLI builds its flags and `--help` from these
fields quickly; `nmt.model.transformer` builds the network from them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, NamedTuple, Optional

from nmt.errors import NmtError
from nmt.settings import FRACTION, POSITIVE, Range, check_ranges, setting as _f


PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
"""The ids of the special tokens in every vocabulary nmt learns (nmt.data.tokenizer): the model
pads with PAD_ID and starts the decoder with BOS_ID; a translation ends at EOS_ID."""


class SpecialIds(NamedTuple):
    """The special token ids of one vocabulary, as the model, the batches and the searches use
    them: sentences are padded with `pad`, end with `eos`, the decoder starts from `bos`, and
    neither pad nor bos is ever generated. nmt's own vocabularies give 0, 1, 2, 3; an imported
    Marian model (`nmt import`) gives eos 0, unk 1, and pad = bos = its last id."""

    pad: int = PAD_ID
    unk: int = UNK_ID
    bos: int = BOS_ID
    eos: int = EOS_ID


NMT_SPECIAL_IDS = SpecialIds()

ACTIVATIONS = ("relu", "swish", "gelu")
"""The feed-forward network's activations (`nmt.model.transformer.FeedForward`); relu is the paper's."""
POSITIONS_LAYOUTS = ("interleaved", "halves")
"""Layouts of the sinusoidal table (`nmt.model.transformer.sinusoidal_positions`); interleaved is the paper's."""


@dataclass
class TransformerConfig:
    """Every hyperparameter of the model; the paper's base model by default (Table 3)."""

    src_vocab_size: int = _f(0, "Source vocabulary size (from the run's vocabulary).")
    tgt_vocab_size: int = _f(0, "Target vocabulary size (from the run's vocabulary).")
    d_model: int = _f(512, "Width of every sublayer output and embedding (paper: 512 base, 1024 big).")
    d_ff: int = _f(2048, "Inner width of the feed-forward network (paper: 2048 base, 4096 big).")
    n_heads: int = _f(8, "Attention heads h; each has d_k = d_v = d_model / h (paper: 8 base, 16 big).")
    encoder_layers: int = _f(6, "Encoder depth N (paper: 6).")
    decoder_layers: int = _f(6, "Decoder depth N (paper: 6).")
    dropout: float = _f(0.1, "Residual dropout P_drop on sublayer outputs and on embeddings + positions (5.4; paper: 0.1 base, 0.3 big En-De).")
    attention_dropout: float = _f(0.0, "Dropout on attention weights (not in the paper; a fairseq/t2t option).")
    relu_dropout: float = _f(0.0, "Dropout after the activation of the feed-forward network (not in the paper).")
    dropout_src: float = _f(0.0, "Source word dropout: in training, each source token's whole embedding is zeroed with this probability and the rest scaled by 1/(1-p), before positions are added (not in the paper; Marian's --dropout-src, for small corpora).")
    dropout_trg: float = _f(0.0, "Target word dropout: the same for the decoder's input tokens (Marian's --dropout-trg).")
    activation: str = _f("relu", "Activation of the feed-forward network: relu (the paper, 3.3), swish (x * sigmoid(x), SiLU: Marian / OPUS-MT) or gelu (exact, erf).")
    max_positions: int = _f(1024, "Longest sequence in subword tokens, eos included; longer training pairs are skipped and counted.")
    share_all_embeddings: bool = _f(True, "One matrix for source embeddings, target embeddings and pre-softmax projection (3.4); needs a joint vocabulary.")
    share_decoder_input_output_embed: bool = _f(True, "Tie target embeddings and the pre-softmax projection (implied by share_all_embeddings).")
    pre_ln: bool = _f(False, "LayerNorm before each sublayer instead of after the residual sum (t2t's later default); the paper is post-LN.")
    positions_layout: str = _f("interleaved", "Where the sinusoids (3.5) go: interleaved (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos, the paper's formula) or halves (the d_model/2 sines, then the cosines of the same frequencies: Marian / OPUS-MT).")
    output_bias: bool = _f(False, "A learned bias, initialised to zero, added to the pre-softmax logits (not in the paper; Marian's final_logits_bias).")
    pad_id: int = _f(PAD_ID, "Id of padding (from the run's vocabulary).")
    unk_id: int = _f(UNK_ID, "Id of the unknown token (from the run's vocabulary).")
    bos_id: int = _f(BOS_ID, "Id of the decoder's first input, the decoder start token (from the run's vocabulary: <s> in nmt's, <pad> in Marian's).")
    eos_id: int = _f(EOS_ID, "Id of the end-of-sentence token (from the run's vocabulary).")

    RANGES: ClassVar[dict[str, Range]] = {
        "src_vocab_size": POSITIVE, "tgt_vocab_size": POSITIVE,
        # Far above the paper's big model (1024, 4096, 16 heads, 6 layers): beyond, a typo, not a model.
        "d_model": Range(1, 2**15), "d_ff": Range(1, 2**18), "n_heads": Range(1, 1024),
        "encoder_layers": Range(1, 1024), "decoder_layers": Range(1, 1024),
        "dropout": FRACTION, "attention_dropout": FRACTION, "relu_dropout": FRACTION,
        "dropout_src": FRACTION, "dropout_trg": FRACTION,
        "max_positions": Range(1, 2**16),  # subword tokens of one sentence; the sinusoids are a table of them
        "pad_id": Range(0, 2**31), "unk_id": Range(0, 2**31), "bos_id": Range(0, 2**31), "eos_id": Range(0, 2**31),
    }
    """The range of every numeric field (`nmt.settings`); `nmt train`'s model flags share it."""

    def validate(self) -> None:
        check_ranges(self)
        for name, allowed in (("activation", ACTIVATIONS), ("positions_layout", POSITIONS_LAYOUTS)):
            if getattr(self, name) not in allowed:
                raise NmtError(f"unknown --{name.replace('_', '-')} {getattr(self, name)!r}; choose one of {', '.join(allowed)}")
        if self.d_model % self.n_heads:
            raise NmtError(f"d_model {self.d_model} must be divisible by the number of heads {self.n_heads}")
        for name, value in zip(("pad_id", "unk_id", "bos_id", "eos_id"), self.special_ids):
            if value >= min(self.src_vocab_size, self.tgt_vocab_size):
                raise NmtError(f"{name} {value} is not an id of the vocabulary ({self.src_vocab_size} / {self.tgt_vocab_size} pieces)")
        if self.share_all_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise NmtError(
                "--share-all-embeddings needs one joint vocabulary, but source and target vocabularies "
                f"differ ({self.src_vocab_size} vs {self.tgt_vocab_size}); re-run `nmt preprocess --joined` "
                "or train with --no-share-all-embeddings"
            )

    @property
    def special_ids(self) -> SpecialIds:
        return SpecialIds(self.pad_id, self.unk_id, self.bos_id, self.eos_id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TransformerConfig":
        """From a checkpoint's or record's dict; fields added since it was written take their defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


VOCAB_FIELDS = ("src_vocab_size", "tgt_vocab_size", "pad_id", "unk_id", "bos_id", "eos_id")
"""Fields that come from the run's vocabulary, never from a flag."""


# Architectures by name: plain builders, not a registry (torchtune style).
# Fields of TransformerConfig that change training, not the shape or meaning of the weights.
NON_ARCHITECTURE_FIELDS = frozenset({"dropout", "attention_dropout", "relu_dropout", "dropout_src", "dropout_trg"})


def architecture(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a configuration (as a dict) that decide what the weights mean: two
    checkpoints with equal architectures can be averaged or resumed into one another. A field
    added since the dict was written has its default, as `TransformerConfig.from_dict` gives it."""
    defaults = {f.name: f.default for f in fields(TransformerConfig)}
    return {k: v for k, v in {**defaults, **config}.items() if k not in NON_ARCHITECTURE_FIELDS}


def transformer_tiny() -> TransformerConfig:
    """For tests: 2+2 layers, d_model 64."""
    return TransformerConfig(d_model=64, d_ff=128, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.1, max_positions=256)


def transformer_mini() -> TransformerConfig:
    """CPU recipe size: 4+4 layers, d_model 128, d_ff 512, 4 heads (the 2.6M-parameter
    Multi30k model of Wu et al., ACL 2021); on two CPU cores it sees about twice the data
    of `small` in the same time, which wins on a 30-minute budget."""
    return TransformerConfig(d_model=128, d_ff=512, n_heads=4, encoder_layers=4, decoder_layers=4, dropout=0.1)


def transformer_small() -> TransformerConfig:
    """CPU-sized: 3+3 layers, d_model 256, d_ff 1024, 4 heads."""
    return TransformerConfig(d_model=256, d_ff=1024, n_heads=4, encoder_layers=3, decoder_layers=3, dropout=0.1)


def transformer_base() -> TransformerConfig:
    """The paper's base model (Table 3): N=6, d_model 512, d_ff 2048, h 8, P_drop 0.1."""
    return TransformerConfig()


def transformer_big() -> TransformerConfig:
    """The paper's big model (Table 3): N=6, d_model 1024, d_ff 4096, h 16, P_drop 0.3 (En-De)."""
    return TransformerConfig(d_model=1024, d_ff=4096, n_heads=16, dropout=0.3)


def student_tiny() -> TransformerConfig:
    """A distilled student (`nmt distill`): a deep encoder and a shallow decoder, 6+2 layers,
    d_model 256, d_ff 1536, 8 heads, the size of Bergamot's tiny students (browsermt/students;
    theirs decode with an SSRU, this one with the paper's decoder layers). The decoder runs once
    per output token, the encoder once per sentence: its layers are where depth is cheap."""
    return TransformerConfig(d_model=256, d_ff=1536, n_heads=8, encoder_layers=6, decoder_layers=2, dropout=0.1)


def student_mini() -> TransformerConfig:
    """A student of the Multi30k recipe's CPU teachers (`mini`, `small`): `mini`'s width with
    one decoder layer, 4+1 layers, d_model 128, d_ff 512, 4 heads."""
    return TransformerConfig(d_model=128, d_ff=512, n_heads=4, encoder_layers=4, decoder_layers=1, dropout=0.1)


ARCHS = {
    "tiny": transformer_tiny,
    "mini": transformer_mini,
    "small": transformer_small,
    "base": transformer_base,
    "big": transformer_big,
    "student-mini": student_mini,
    "student-tiny": student_tiny,
}


SIZE_FIELDS = ("encoder_layers", "decoder_layers", "d_model", "d_ff", "n_heads")
"""What tells the named architectures apart."""


def model_size(model: TransformerConfig) -> str:
    """'2+2 layers, d_model 64, d_ff 256, 4 heads'."""
    return (f"{model.encoder_layers}+{model.decoder_layers} layers, d_model {model.d_model}, d_ff {model.d_ff}, "
            f"{model.n_heads} heads")


def arch_of(model: TransformerConfig) -> Optional[str]:
    """The named architecture (`nmt archs`) that has the model's size, or None. Read from the
    size, not from the run's record: a model fine-tuned from its own checkpoint (an imported
    one has no --arch) is recorded under the default --arch base whatever its size."""
    size = [getattr(model, k) for k in SIZE_FIELDS]
    return next((name for name, build in ARCHS.items() if [getattr(build(), k) for k in SIZE_FIELDS] == size), None)


def check_arch(arch: str) -> None:
    """A one-line error for an architecture name that is not in ARCHS."""
    if arch not in ARCHS:
        raise NmtError(f"unknown --arch {arch!r}; known architectures: {', '.join(ARCHS)}")


def build_config(arch: str, src_vocab_size: int, tgt_vocab_size: int, special_ids: SpecialIds = NMT_SPECIAL_IDS,
                 **overrides: Any) -> TransformerConfig:
    """The named architecture with vocabulary sizes, special ids and any single-field overrides applied."""
    check_arch(arch)
    cfg = replace(ARCHS[arch](), src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                  pad_id=special_ids.pad, unk_id=special_ids.unk, bos_id=special_ids.bos, eos_id=special_ids.eos)
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    cfg.validate()
    return cfg
