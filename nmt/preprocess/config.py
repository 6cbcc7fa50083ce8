"""Every `nmt preprocess` setting in one dataclass: the CLI flags, `--help` and the record come from it."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

from nmt.preprocess.cleaning import CleaningRules
from nmt.errors import NmtError
from nmt.settings import COUNT, INT32_MAX, POSITIVE, SEED, THREADS, Range, check_ranges, setting
from nmt.data.tokenizer import SPECIAL_TOKENS, VOCAB_TYPES

SETTINGS_ADDED = {"subword_samples": 0}
"""Settings added after run directories already existed, with the value those were made with."""
SETTINGS_REMOVED = {"subword_sides": "source"}
"""Settings since removed, with the behaviour nmt kept: a record holding that value was made as nmt makes it now."""
RECORD = "preprocess"
"""The run directory's record of a preprocessing result: config/preprocess.json."""
ENCODING_ERRORS = ("strict", "replace")
NORMALIZATION = (
    "SentencePiece (bpe, unigram): NFKC, whitespace runs collapsed, ends stripped; "
    "WordPiece: NFKC, ends stripped; uncovered characters become <unk>, decoded as ' \u2047 ' by both; "
    "with moses: the ids decode to Moses-normalized, tokenized text (nmt.data.moses.moses_postprocess undoes it)"
)


def check_language_code(what: str, lang: Any) -> str:
    """`lang`, if it is a language code: letters, digits, '-' and '_' only. A code names files
    (PREFIX.LANG, vocab/LANG.model, an export's LANG_source.spm), so a '/' or '..' in it would
    write outside the folder nmt was given. The one rule for every command that takes a code
    (preprocess's -s/-t, import, export); `what` says where the code came from."""
    if not isinstance(lang, str) or not lang or not all(c.isalnum() or c in "-_" for c in lang):
        raise NmtError(f"{what} {lang!r} may only hold letters, digits, '-' and '_'")
    return lang


@dataclass
class PreprocessConfig:
    """Every `nmt preprocess` setting; the CLI flags, `--help` and the record come from here."""

    source_lang: str = setting("", "Source language: input files are PREFIX.SRC (or PREFIX.SRC.gz), e.g. en.")
    target_lang: str = setting("", "Target language: input files are PREFIX.TGT (or PREFIX.TGT.gz), e.g. de.")
    trainpref: Optional[str] = setting(None, "Training data prefix (required unless --vocab is given).")
    validpref: Optional[str] = setting(None, "Validation data prefix (split 'valid'; never filtered).")
    testpref: Optional[str] = setting(None, "Test data prefixes, comma-separated: splits test, test1, test2, ... (never filtered).")
    vocab_type: str = setting("bpe", "bpe (SentencePiece BPE: the paper's En-De setup), unigram (SentencePiece unigram LM) "
                              "or wordpiece (WordPiece: the paper's En-Fr setup).")
    vocab_size: int = setting(8000, "Subword vocabulary size (paper: about 37000 shared BPE pieces for WMT14 En-De, "
                              "32000 word-pieces for En-Fr; 8000 suits Multi30k).")
    joined: bool = setting(True, "One vocabulary for both languages (needed to share all embeddings, paper 3.4); "
                           "--no-joined learns one per language.")
    vocab: Optional[str] = setting(None, "Reuse this vocabulary instead of learning one: a tokenizer file (.model or .json; "
                                   "both sides) or a folder or run dir holding joint.* or SRC.* and TGT.*; or a run made by `nmt import` "
                                   "(its source.spm, target.spm and vocab.json, to fine-tune that model).")
    vocab_sample_lines: int = setting(10_000_000, "Learn the vocabulary from at most this many training pairs (lines "
                                      "per file), sampled uniformly (with --seed) when there are more.")
    character_coverage: float = setting(1.0, "Share of characters SentencePiece must cover (1.0 for Latin scripts, "
                                        "0.9995 for large character sets).")
    moses: bool = setting(False, "Moses punctuation normalization and tokenization (sacremoses) before everything else; "
                          "`nmt translate` undoes it.")
    min_len: int = setting(1, "Drop training pairs with a side of fewer whitespace words (clean-corpus-n min).")
    max_len: int = setting(250, "Drop training pairs with a side of more whitespace words (clean-corpus-n max; "
                           "fairseq's WMT14 script: 250).")
    max_ratio: float = setting(9.0, "Drop training pairs whose longer side has more than this many times the words of the "
                               "other (clean-corpus-n default 9; fairseq's WMT14 script: 1.5).")
    encoding_errors: str = setting("strict", "strict: invalid UTF-8 is an error naming file and line; "
                                   "replace: substitute U+FFFD and go on.")
    subword_samples: int = setting(0, "Subword regularization: also store this many sampled segmentations of the training "
                                   "pairs' source side (splits train.sample1..K; the target keeps its deterministic "
                                   "segmentation, which the decoder learns to write: sampling it too lost on Multi30k); "
                                   "`nmt train` trains epoch e on sample ((e-1) mod K)+1. "
                                   "bpe: BPE-dropout (Provilkov et al. 2020); unigram: sampling (Kudo 2018); not for "
                                   "wordpiece. Valid, test and translation keep the deterministic segmentation. 0: off.")
    subword_alpha: float = setting(0.1, "With --subword-samples: bpe: the probability of dropping each merge (Provilkov et "
                                   "al.: 0.1); unigram: the smoothing of the sampling distribution (SentencePiece: 0.1; "
                                   "all segmentations, nbest -1).")
    seed: int = setting(1, "Seed of the uniform sample of training pairs the vocabulary is learned from, and of "
                        "--subword-samples.")
    workers: int = setting(0, "Worker processes for tokenization (0: all cores); does not change the result, except "
                         "that SentencePiece's unigram training (--vocab-type unigram) varies slightly with its thread count.")

    def test_prefixes(self) -> list[str]:
        return [p.strip() for p in (self.testpref or "").split(",") if p.strip()]

    def split_prefixes(self) -> dict[str, str]:
        """{split name: prefix}, named as fairseq does: train, valid, test, test1, test2, ..."""
        splits = {}
        if self.trainpref:
            splits["train"] = self.trainpref
        if self.validpref:
            splits["valid"] = self.validpref
        for i, prefix in enumerate(self.test_prefixes()):
            splits["test" if i == 0 else f"test{i}"] = prefix
        return splits

    def effective_workers(self) -> int:
        if self.workers > 0:
            return self.workers
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1

    def rules(self) -> CleaningRules:
        return CleaningRules(min_len=self.min_len, max_len=self.max_len, max_ratio=self.max_ratio)

    RANGES: ClassVar[dict[str, Range]] = {
        "vocab_size": Range(len(SPECIAL_TOKENS) + 1, INT32_MAX), "vocab_sample_lines": POSITIVE,
        "character_coverage": Range(0.0, 1.0, low_open=True), "min_len": COUNT, "max_len": POSITIVE,
        "max_ratio": Range(1.0, math.inf, high_open=True), "seed": SEED, "workers": THREADS,
        "subword_samples": Range(0, 1000), "subword_alpha": Range(0.0, 1.0, low_open=True),
    }
    """The range of every numeric setting (`nmt.settings`); the vocabulary holds the special tokens and more."""

    def validate(self) -> None:
        """Check the settings alone, before touching any file."""
        check_ranges(self)
        for flag, lang in (("--source-lang/-s", self.source_lang), ("--target-lang/-t", self.target_lang)):
            if not lang:
                raise NmtError(f"{flag} is required (the file suffix of that language, e.g. en)")
            check_language_code(flag, lang)
        if self.source_lang == self.target_lang:
            raise NmtError(f"--source-lang and --target-lang are both {self.source_lang!r}; they must differ")
        if self.vocab_type not in VOCAB_TYPES:
            raise NmtError(f"unknown --vocab-type {self.vocab_type!r}; choose one of {', '.join(VOCAB_TYPES)}")
        if self.encoding_errors not in ENCODING_ERRORS:
            raise NmtError(f"unknown --encoding-errors {self.encoding_errors!r}; choose strict or replace")
        if not self.split_prefixes():
            raise NmtError("no input given; pass --trainpref (and --validpref, --testpref)")
        if not self.trainpref and not self.vocab:
            raise NmtError("--trainpref is required to learn a vocabulary (or pass --vocab to reuse one)")
        if self.subword_samples and not self.trainpref:
            raise NmtError("--subword-samples samples segmentations of the training data; pass --trainpref too")
        if self.subword_samples and self.vocab_type == "wordpiece" and not self.vocab:
            raise NmtError("--subword-samples needs a SentencePiece vocabulary: WordPiece cuts words by greedy longest "
                           "match and has no segmentations to sample; use --vocab-type bpe (BPE-dropout) or unigram")
        if self.max_len < self.min_len:
            raise NmtError(f"--min-len {self.min_len} is more than --max-len {self.max_len}; no pair could be kept")

    def settings(self) -> dict[str, Any]:
        """The settings that determine the result (paths made absolute; `workers` left out)."""
        s = asdict(self)
        del s["workers"]
        if not self.subword_samples:  # alpha means nothing then
            del s["subword_alpha"]
        for key in ("trainpref", "validpref", "vocab"):
            if s[key]:
                s[key] = str(Path(s[key]).absolute())
        if self.testpref:
            s["testpref"] = ",".join(str(Path(p).absolute()) for p in self.test_prefixes())
        return s
