"""The Python API: a trained run as an object that translates strings (`nmt.load`).

It is `nmt translate` without the command line: the same run directory, the same checkpoint
choice (checkpoint_avg.pt, else _best, else _last, or the ones given), the same settings
with the same names as the flags, and the same guarantees (one output per input, in order;
an empty line gives an empty translation). Every SearchConfig, TranslateConfig and
AlignmentConfig field is accepted as a keyword, so a flag added to `nmt translate` is a
keyword here too. Each call may also give target prefixes (`prefix=`), constraint phrases
(`constraints=`) and ask for word alignments (`alignment="hard"` or `"soft"`).
"""

from __future__ import annotations

import copy
import numbers
import os
from collections import OrderedDict
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union, overload

from nmt.data.textio import lone_surrogate
from nmt.errors import NmtError
from nmt.run.directory import RunDir
from nmt.inference.translator import Translation, Translator, load_translator
from nmt.inference.config import ALIGNMENT_FORMATS, AlignmentConfig, SearchConfig, TranslateConfig

SEARCH_FIELDS = frozenset(f.name for f in fields(SearchConfig))
TRANSLATE_FIELDS = frozenset(f.name for f in fields(TranslateConfig))
ALIGNMENT_FIELDS = frozenset(f.name for f in fields(AlignmentConfig))
FIELD_TYPES = {f.name: f.type for f in fields(SearchConfig) + fields(TranslateConfig) + fields(AlignmentConfig)}
"""Each setting's type as the dataclasses write it ("int", "float", "str")."""
SETTINGS_CACHED = 8
"""Per-call settings whose translators a Model keeps (the least recently used goes first): a
program that varies beam or lenpen per call kept one per combination it ever used."""


class Model:
    """A trained run's model(s) and tokenizers, loaded once; not safe to call from several threads at once."""

    def __init__(self, translator: Translator, source_lang: str, target_lang: str, run_dir: Path):
        self.translator = translator
        self.source_lang, self.target_lang, self.run_dir = source_lang, target_lang, run_dir
        self._by_search: OrderedDict[tuple, Translator] = OrderedDict()
        """Translators of per-call settings, least recently used first (`with_search`)."""

    @property
    def checkpoints(self) -> list[Path]:
        """The checkpoint file(s) translating (several: an ensemble)."""
        return list(self.translator.checkpoints)

    @property
    def decoder_path(self) -> str:
        """What searches: "native" (nmt's C++ kernels, fp32 CPU), "stock" (PyTorch's ops) or
        "ctranslate2" (--engine); choose with `nmt.load(..., decoder="stock")`."""
        return self.translator.decoder_path

    @property
    def search(self) -> SearchConfig:
        """The default beam search settings; each call may override any of them by keyword."""
        return self.translator.search

    @overload
    def translate(self, text: str, prefix: Optional[str] = None, constraints: Optional[Sequence[str]] = None,
                  **search: Any) -> str: ...
    @overload
    def translate(self, text: Sequence[str], prefix: Optional[Sequence[str]] = None,
                  constraints: Optional[Sequence[Sequence[str]]] = None, **search: Any) -> list[str]: ...

    def translate(self, text: Union[str, Sequence[str]], prefix: Any = None, constraints: Any = None,
                  **search: Any) -> Union[str, list[str]]:
        """The best translation of a sentence (a str), or of each sentence of a list, in order.

        `prefix`: the text the translation starts with (a str; for a list, one per sentence,
        "" for none). `constraints`: phrases the translation must contain (a list of str; for a
        list of sentences, one such list per sentence). Keywords override the beam search
        settings for this call: beam, lenpen, max_len_b, ...
        """
        found = self.translate_nbest(text, prefix, constraints, **search)
        return found.hyp if isinstance(found, Translation) else [t.hyp for t in found]

    @overload
    def translate_nbest(self, text: str, prefix: Optional[str] = None, constraints: Optional[Sequence[str]] = None,
                        alignment: Optional[str] = None, **search: Any) -> Translation: ...
    @overload
    def translate_nbest(self, text: Sequence[str], prefix: Optional[Sequence[str]] = None,
                        constraints: Optional[Sequence[Sequence[str]]] = None, alignment: Optional[str] = None,
                        **search: Any) -> list[Translation]: ...

    def translate_nbest(self, text: Union[str, Sequence[str]], prefix: Any = None, constraints: Any = None,
                        alignment: Optional[str] = None, **search: Any) -> Union[Translation, list[Translation]]:
        """Like `translate`, but each answer is a Translation: `hyp`, its `score` (length-penalized
        log-probability; None for an empty sentence), the `nbest` (hypothesis, score) pairs,
        best first (`nbest=N` keeps N of the `beam`), and with `alignment="hard"` (Pharaoh
        "i-j" word pairs) or `"soft"` (output words x input words weights) its `alignment`."""
        if isinstance(text, str):
            lines = [text]
            if prefix is not None and not isinstance(prefix, str):
                raise NmtError(f"prefix of one sentence is a str, not {type(prefix).__name__}")
            prefixes = None if prefix is None else [prefix]
            phrases = None if constraints is None else [_checked_list(constraints, "constraints", "of one sentence is a list of str")]
        else:
            lines = _checked_lines(text)
            prefixes = None if prefix is None else _checked_list(
                prefix, "prefix", 'of a list of sentences is a list of str, one per sentence ("" for none)')
            phrases = None if constraints is None else [
                _checked_list(c, f"constraints[{i}]", "is a list of str")
                for i, c in enumerate(_checked_list(constraints, "constraints", "of a list of sentences is a list of "
                                                    "lists of str, one list per sentence", (list, tuple)))]
        for name, value in (("text", text), ("prefix", prefix), ("constraints", constraints)):
            _check_characters(name, value)
        found = self.translate_lines(lines, prefixes, phrases, alignment, **search)
        return found[0] if isinstance(text, str) else found

    def translate_lines(self, lines: Sequence[str], prefixes: Optional[Sequence[str]] = None,
                        constraints: Optional[Sequence[Sequence[str]]] = None, alignment: Optional[str] = None,
                        **search: Any) -> list[Translation]:
        """One Translation per line, in order, read in buffers of `buffer_size` lines as
        `nmt translate` reads its input (so a long list is not all sorted in memory at once)."""
        for name, given in (("prefix", prefixes), ("constraints", constraints)):
            if given is not None and len(given) != len(lines):
                raise NmtError(f"{len(given)} {name} for {len(lines)} sentences; give one per sentence")
        translator = self.with_search(alignment=alignment, **search)
        out: list[Translation] = []
        size = translator.cfg.buffer_size
        for start in range(0, len(lines), size):
            part = slice(start, start + size)
            out.extend(translator.translate(lines[part], prefixes[part] if prefixes is not None else None,
                                            constraints[part] if constraints is not None else None, first_line=start + 1))
        return out

    def with_search(self, alignment: Optional[str] = None, **search: Any) -> Translator:
        """The translator with some beam search settings changed, and word alignments in the
        `alignment` format ("hard", "soft"; None: as loaded), models and tokenizers shared."""
        unknown = set(search) - SEARCH_FIELDS
        if unknown:
            raise TypeError(f"unknown beam search setting(s) {', '.join(sorted(unknown))}; "
                            f"use any of {', '.join(sorted(SEARCH_FIELDS))}")
        if alignment is not None and alignment not in ALIGNMENT_FORMATS:
            raise NmtError(f"alignment must be one of {', '.join(ALIGNMENT_FORMATS)} (or None), not {alignment!r}")
        if not search and alignment is None:
            return self.translator
        wanted = replace(self.translator.search, **_checked_types(search))
        key = (tuple(sorted(vars(wanted).items())), alignment)
        if key in self._by_search:
            self._by_search.move_to_end(key)
            return self._by_search[key]
        wanted.validate()
        translator = copy.copy(self.translator)
        translator.search = wanted
        if alignment is not None:
            base = self.translator.alignment or AlignmentConfig()
            translator.alignment = replace(base, print_alignment=True, alignment_format=alignment)
            translator.alignment_layer = translator.alignment.layer_of(translator.decoder.decoder_layers)
        self._by_search[key] = translator
        if len(self._by_search) > SETTINGS_CACHED:
            self._by_search.popitem(last=False)
        return translator

    def __repr__(self) -> str:
        return f"nmt.Model({str(self.run_dir)!r}, {self.source_lang}->{self.target_lang}, checkpoints={[str(c) for c in self.checkpoints]})"


def _checked_lines(text: Any) -> list[str]:
    """`text` as a list of str, or a TypeError saying what was given instead."""
    if isinstance(text, (bytes, bytearray)):
        raise TypeError("translate takes a str or a list of str, not bytes; decode it first (e.g. text.decode('utf-8'))")
    return _checked_list(text, "translate", "takes a str or a list of str", error=TypeError)


def _checked_list(value: Any, name: str, shape: str, item: Union[type, tuple[type, ...]] = str,
                  error: type[Exception] = NmtError) -> list:
    """`value` as a list of `item`s, or `error` saying the shape `name` must have and what it
    got: "prefix of a list of sentences is a list of str, ..., not str". A prefix's or the
    constraints' shape is named for the text given (one sentence or a list): "takes a str or a
    list of str, not str" contradicted itself."""
    if not isinstance(value, (list, tuple)):
        raise error(f"{name} {shape}, not {type(value).__name__}")
    for i, v in enumerate(value):
        if not isinstance(v, item):
            raise error(f"{name} {shape}, but item {i} is a {type(v).__name__}")
    return list(value)


def _check_characters(name: str, value: Union[None, str, Sequence]) -> None:
    """An NmtError naming where a lone surrogate ("\\ud800") sits in text, a prefix or a phrase:
    Python strings allow one, but it is no character, and the tokenizer's error ("List elements
    must be str or bytes") named neither the argument nor the problem."""
    if isinstance(value, str):
        found = lone_surrogate(value)
        if found is not None:
            raise NmtError(f"{name} holds a lone surrogate {found}, which is no character; pass whole surrogate pairs")
    elif value is not None:
        for i, item in enumerate(value):
            _check_characters(f"{name}[{i}]", item)


_EXPECTED = {"int": (numbers.Integral, int, "an int"), "float": (numbers.Real, float, "a number"),
             "str": ((str, os.PathLike), os.fspath, "a str")}


def _checked_types(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` as plain int, float and str (numpy numbers, an int where a float goes and a
    path where a str goes are fine), or an NmtError naming the setting: a wrong type (None, a
    list) would fail deep in the search, and numpy numbers would be refused by validate."""
    checked = dict(settings)
    for name, value in settings.items():
        if FIELD_TYPES[name] in _EXPECTED:
            kind, make, wanted = _EXPECTED[FIELD_TYPES[name]]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise NmtError(f"{name} must be {wanted}, not {type(value).__name__} {value!r:.40}")
            checked[name] = make(value)
    return checked


def load(run_dir: Union[str, Path], checkpoint: Union[None, str, Path, Sequence[Union[str, Path]]] = None,
         **settings: Any) -> Model:
    """See `nmt.load`."""
    unknown = set(settings) - SEARCH_FIELDS - TRANSLATE_FIELDS - ALIGNMENT_FIELDS
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(sorted(unknown))}; "
                        f"use any of {', '.join(sorted(SEARCH_FIELDS | TRANSLATE_FIELDS | ALIGNMENT_FIELDS))}")
    settings = _checked_types(settings)
    alignment = AlignmentConfig(**{k: v for k, v in settings.items() if k in ALIGNMENT_FIELDS})
    alignment.validate()
    search = SearchConfig(**{k: v for k, v in settings.items() if k in SEARCH_FIELDS})
    cfg = TranslateConfig(**{k: v for k, v in settings.items() if k in TRANSLATE_FIELDS})
    if checkpoint is None:
        checkpoints: list[Union[str, Path]] = []
    elif isinstance(checkpoint, (str, Path)):
        checkpoints = [checkpoint]
    else:
        checkpoints = list(checkpoint)
    run_dir = Path(run_dir)
    translator = load_translator(run_dir, checkpoints, search, cfg, alignment=alignment)
    record = RunDir(run_dir).read_record("preprocess")
    return Model(translator, record["source_lang"], record["target_lang"], run_dir)
