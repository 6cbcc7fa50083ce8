"""Settings of `nmt translate`: the beam search (the paper's, Section 6.1) and how input is
read, batched and run. Plain dataclasses without torch, so `nmt --help` stays fast; the CLI
flags, their defaults and their help all come from these fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from nmt.errors import NmtError
from nmt.settings import COUNT, POSITIVE, THREADS, Range, check_ranges, setting

LENPEN_STYLES = ("gnmt", "avg")
BEAM_STYLES = ("t2t", "fairseq", "shrink")
AMP_CHOICES = ("auto", "none", "bf16", "fp16")
ENGINES = ("nmt", "ctranslate2")
DECODERS = ("auto", "native", "stock")
"""nmt's two CPU decoding steps (`nmt.ops.optimize_for` chooses one per model): why two, docs/performance.md."""
ALIGNMENT_FORMATS = ("hard", "soft")
MAX_BEAM = 128
"""The widest beam: 32x the paper's 4, far past where BLEU stops improving (wider beams lose
it, Koehn and Knowles 2017), while each sentence holds --beam rows of decoder state."""


@dataclass
class SearchConfig:
    """Beam search settings; the paper's by default (Section 6.1). The CLI flags come from here."""

    beam: int = setting(4, f"Beam size: hypotheses searched per sentence (paper: 4; at most {MAX_BEAM}).")
    beam_style: str = setting(
        "t2t",
        "t2t: the paper's search, as tensor2tensor's beam_search.py: k hypotheses stay alive, chosen from the 2k "
        "best extensions, the k best finished ones are kept, and a sentence stops when no alive hypothesis can "
        "still beat them under the length penalty (the result is the best hypothesis this search can reach). "
        "fairseq: as fairseq's sequence_generator and CTranslate2 (patience 1): k stay alive and a sentence stops "
        "once k have finished. shrink: as dl4mt/Nematus: each finished hypothesis takes its slot with it, the "
        "beam narrows until none is left (beam 1 is greedy search).",
    )
    lenpen: float = setting(0.6, "Length penalty alpha (paper: 0.6); 0 ranks hypotheses by log-probability alone.")
    lenpen_style: str = setting(
        "gnmt",
        "gnmt: score / ((5+|Y|)/6)^alpha, as the paper's tensor2tensor; avg: score / |Y|^alpha, as fairseq. "
        "|Y| counts the end-of-sentence token.",
    )
    max_len_a: float = setting(1.0, "a of the output length limit a * source length + b, in subword tokens (paper: 1).")
    max_len_b: int = setting(50, "b of the output length limit a * source length + b (paper: 50); capped by the model's positions.")
    nbest: int = setting(1, "Hypotheses kept per sentence, best first (listed by --format jsonl).")

    RANGES: ClassVar[dict[str, Range]] = {
        "beam": Range(1, MAX_BEAM), "nbest": Range(1, MAX_BEAM),
        # Published alphas lie in [0, 2]; past 10 the penalty, not the model, picks the output.
        "lenpen": Range(0.0, 10.0),
        # Past 1000, a no longer limits anything (the model's positions do); a huge one overflows a * length.
        "max_len_a": Range(0.0, 1000.0), "max_len_b": COUNT,
    }
    """The range of every numeric setting (`nmt.settings`)."""

    def max_output_length(self, source_length: int, max_positions: int) -> int:
        """Tokens a sentence of `source_length` tokens (eos excluded) may generate before eos:
        floor(a * |X| + b), capped so that bos + tokens fit `max_positions`. Every engine's
        limit comes from here, so nmt's search and CTranslate2's stop at the same length."""
        return min(max(math.floor(self.max_len_a * source_length + self.max_len_b), 0), max_positions - 1)

    def validate(self) -> None:
        check_ranges(self)
        if self.nbest > self.beam:
            raise NmtError(f"--nbest must be between 1 and --beam ({self.beam}), not {self.nbest}")
        if self.beam_style not in BEAM_STYLES:
            raise NmtError(f"unknown --beam-style {self.beam_style!r}; choose one of {', '.join(BEAM_STYLES)}")
        if self.lenpen_style not in LENPEN_STYLES:
            raise NmtError(f"unknown --lenpen-style {self.lenpen_style!r}; choose one of {', '.join(LENPEN_STYLES)}")


DEFAULT_BATCH_TOKENS = 4096
"""Source tokens per batch of nmt's own decoder (and of CTranslate2 on a GPU) under --max-tokens 0."""
CTRANSLATE2_CPU_BATCH_TOKENS = 1024
"""Source tokens per batch of --engine ctranslate2 on a CPU under --max-tokens 0: CTranslate2's
self-attention cache of a batch grows by every step decoded, so its memory follows the batch:
1024-token batches held about a third of 4096's peak RSS at about the same speed
(bench/results/2026-12-04_b0b29fe_zen4_ct2-batch-tokens.json)."""


@dataclass
class TranslateConfig:
    """How input is read and batched, and where the model runs. The CLI flags come from here."""

    max_tokens: int = setting(
        0,
        "Source tokens per batch, padding included (the decoder holds --beam rows per sentence); batches are cut "
        "from length-sorted input. 0 (auto): 4096, and 1024 for --engine ctranslate2 on a CPU, where CTranslate2 "
        "keeps every decoded step's keys and values of each batch in flight: its peak RSS a third, for 0.97x the speed.",
    )
    buffer_size: int = setting(10000, "Lines read, sorted and translated at a time; output streams buffer by buffer.")
    encoding_errors: str = setting("strict", "Invalid UTF-8 in the input: strict (error naming the line) or replace (with U+FFFD).")
    device: str = setting("auto", "auto (a GPU when there is one), cpu, cuda or cuda:N.")
    threads: int = setting(0, "CPU threads for the model and the tokenizer (0: PyTorch's default, one per core).")
    inter_threads: int = setting(
        0,
        "Batches searched at once on a CPU, each on --threads / N threads (CTranslate2's inter_threads x "
        "intra_threads; Marian's CPU workers): a decoder step is many small products, which one thread each runs "
        "better than two threads share. 0 (auto): the largest divisor of --threads up to 4, 1 with --sampling "
        "(one random stream in input order) and on a GPU. Each batch in flight holds its own search state.",
    )
    amp: str = setting("auto", "Weights and activations in bf16 or fp16 (auto: bf16 on a GPU that supports it, else fp32); scores stay fp32.")
    engine: str = setting(
        "nmt",
        "nmt: this package's decoder. ctranslate2: CTranslate2 (pip install 'nmt\\[ct2]') on the model exported by "
        "`nmt export --format ctranslate2` (--ct2-model), or exported first into RUN/ctranslate2/; it searches "
        "with its own rule only, which the command line takes unless told otherwise (said on stderr): "
        "--beam-style fairseq --lenpen-style avg; other styles given with it are refused.",
    )
    decoder: str = setting(
        "auto",
        "The decoder step of nmt's engine in fp32 on a CPU: native, nmt's C++ kernels (built once per CPU by "
        "`make install` or the first model load; needs a C++ compiler and ninja); stock, PyTorch's ops as in "
        "nmt/model/transformer.py; auto: native where the kernels build, else stock (said on stderr). The same "
        "maths: outputs may differ in the last bits of a score. Other dtypes and GPUs decode with the stock step.",
    )
    ct2_model: str = setting("", "CTranslate2 model directory for --engine ctranslate2 (default: RUN/ctranslate2/CHECKPOINT, exported when missing or older than the checkpoint).")
    ct2_compute_type: str = setting("default", "CTranslate2 compute type (default: the exported weights' type; int8, int8_float32, float32, bfloat16, ...).")

    RANGES: ClassVar[dict[str, Range]] = {"max_tokens": COUNT, "buffer_size": POSITIVE, "threads": THREADS,
                                          "inter_threads": THREADS}
    """The range of every numeric setting (`nmt.settings`)."""

    def validate(self) -> None:
        check_ranges(self)
        if self.encoding_errors not in ("strict", "replace"):
            raise NmtError(f"--encoding-errors must be strict or replace, not {self.encoding_errors!r}")
        if self.amp not in AMP_CHOICES:
            raise NmtError(f"--amp must be one of {', '.join(AMP_CHOICES)}, not {self.amp!r}")
        if self.decoder not in DECODERS:
            raise NmtError(f"--decoder must be one of {', '.join(DECODERS)}, not {self.decoder!r}")
        if self.engine not in ENGINES:
            raise NmtError(f"--engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")

    def batch_tokens(self, ctranslate2_on_cpu: bool = False) -> int:
        """--max-tokens, or what 0 (auto) means for the engine that batches: CTRANSLATE2_CPU_BATCH_TOKENS
        for CTranslate2 on a CPU (why: there), else DEFAULT_BATCH_TOKENS."""
        if self.max_tokens:
            return self.max_tokens
        return CTRANSLATE2_CPU_BATCH_TOKENS if ctranslate2_on_cpu else DEFAULT_BATCH_TOKENS


@dataclass
class AlignmentConfig:
    """Word alignments of each translation (`nmt.inference.word_alignment`). The CLI flags come from here."""

    print_alignment: bool = setting(
        False,
        "Also give each line's word alignment: source word i - output word j pairs (Pharaoh format, from 0, as "
        "fast_align and fairseq print them), after \" ||| \" in text output (Marian's way) or as \"alignment\" in "
        "jsonl. From the encoder-decoder attention of the best hypothesis in --alignment-layer, its heads averaged "
        "(fairseq's way), with subwords merged into the words of the input line and of the output line.",
    )
    alignment_format: str = setting("hard", "hard: each output word with the source word it attends to most; "
                                            "soft: every output word's attention over the source words (rows sum to 1).")
    alignment_layer: int = setting(-1, "Decoder layer whose attention aligns (from 0; negative: from the end). -1: the "
                                       "last, fairseq's default. Which layer aligns best depends on the model: `make bench-alignment` "
                                       "measures each (the recipe's `mini` aligned best with -2; docs/translation.md).")

    RANGES: ClassVar[dict[str, Range]] = {"alignment_layer": Range(-64, 63)}
    """The range of every numeric setting (`nmt.settings`); the model's depth is checked where it is known."""

    def validate(self) -> None:
        check_ranges(self)
        if self.alignment_format not in ALIGNMENT_FORMATS:
            raise NmtError(f"--alignment-format must be one of {', '.join(ALIGNMENT_FORMATS)}, not {self.alignment_format!r}")

    def layer_of(self, decoder_layers: int) -> int:
        """The alignment layer's index from 0 in a decoder of `decoder_layers`, or an NmtError."""
        if not -decoder_layers <= self.alignment_layer < decoder_layers:
            raise NmtError(f"--alignment-layer {self.alignment_layer} is not a layer of this model's {decoder_layers}-layer "
                           f"decoder; give one from {-decoder_layers} to {decoder_layers - 1}")
        return self.alignment_layer % decoder_layers


def resolve_inter_threads(inter_threads: int, threads: int, device_type: str, sampling: bool = False) -> int:
    """--inter-threads as given (at most `threads`), or what 0 (auto) means: on a CPU, the
    largest divisor of `threads` up to 4 (a worker per core on small machines, few enough
    batches in flight on large ones); 1 on a GPU and with --sampling, whose one random stream
    must be drawn in input order for a seed to reproduce its outputs."""
    if device_type != "cpu" or sampling:
        return 1
    if inter_threads:
        return max(1, min(inter_threads, threads))
    return max(d for d in range(1, min(threads, 4) + 1) if threads % d == 0)
