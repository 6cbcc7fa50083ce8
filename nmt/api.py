"""The Python API: a trained run as an object that translates strings (`nmt.load`).

It is `nmt translate` without the command line: the same run directory, the same checkpoint
choice (checkpoint_avg.pt, else _best, else _last, or the ones given), the same settings
with the same names as the flags, and the same guarantees (one output per input, in order;
an empty line gives an empty translation). Every SearchConfig and TranslateConfig field is
accepted as a keyword, so a flag added to `nmt translate` is a keyword here too.
"""

from __future__ import annotations

import copy
import numbers
import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Sequence, Union, overload

from nmt.errors import NmtError
from nmt.run.directory import RunDir
from nmt.inference.translator import Translation, Translator, buffers, load_translator
from nmt.inference.config import SearchConfig, TranslateConfig

SEARCH_FIELDS = frozenset(f.name for f in fields(SearchConfig))
TRANSLATE_FIELDS = frozenset(f.name for f in fields(TranslateConfig))
FIELD_TYPES = {f.name: f.type for f in fields(SearchConfig) + fields(TranslateConfig)}
"""Each setting's type as the dataclasses write it ("int", "float", "str")."""


class Model:
    """A trained run's model(s) and tokenizers, loaded once; not safe to call from several threads at once."""

    def __init__(self, translator: Translator, source_lang: str, target_lang: str, run_dir: Path):
        self.translator = translator
        self.source_lang, self.target_lang, self.run_dir = source_lang, target_lang, run_dir
        self._by_search: dict[tuple, Translator] = {}

    @property
    def checkpoints(self) -> list[Path]:
        """The checkpoint file(s) translating (several: an ensemble)."""
        return list(self.translator.checkpoints)

    @property
    def search(self) -> SearchConfig:
        """The default beam search settings; each call may override any of them by keyword."""
        return self.translator.search

    @overload
    def translate(self, text: str, **search: Any) -> str: ...
    @overload
    def translate(self, text: Sequence[str], **search: Any) -> list[str]: ...

    def translate(self, text: Union[str, Sequence[str]], **search: Any) -> Union[str, list[str]]:
        """The best translation of a sentence (a str), or of each sentence of a list, in order.

        Keywords override the beam search settings for this call: beam, lenpen, max_len_b, ...
        """
        found = self.translate_nbest(text, **search)
        return found.hyp if isinstance(found, Translation) else [t.hyp for t in found]

    @overload
    def translate_nbest(self, text: str, **search: Any) -> Translation: ...
    @overload
    def translate_nbest(self, text: Sequence[str], **search: Any) -> list[Translation]: ...

    def translate_nbest(self, text: Union[str, Sequence[str]], **search: Any) -> Union[Translation, list[Translation]]:
        """Like `translate`, but each answer is a Translation: `hyp`, its `score` (length-penalized
        log-probability; None for an empty sentence) and the `nbest` (hypothesis, score) pairs,
        best first (`nbest=N` keeps N of the `beam`)."""
        if isinstance(text, str):
            return self.translate_lines([text], **search)[0]
        return self.translate_lines(_checked_lines(text), **search)

    def translate_lines(self, lines: Sequence[str], **search: Any) -> list[Translation]:
        """One Translation per line, in order, read in buffers of `buffer_size` lines as
        `nmt translate` reads its input (so a long list is not all sorted in memory at once)."""
        translator = self.with_search(**search)
        out: list[Translation] = []
        for chunk in buffers(lines, translator.cfg.buffer_size):
            out.extend(translator.translate(chunk))
        return out

    def with_search(self, **search: Any) -> Translator:
        """The translator with some beam search settings changed (models and tokenizers shared)."""
        unknown = set(search) - SEARCH_FIELDS
        if unknown:
            raise TypeError(f"unknown beam search setting(s) {', '.join(sorted(unknown))}; "
                            f"use any of {', '.join(sorted(SEARCH_FIELDS))}")
        if not search:
            return self.translator
        wanted = replace(self.translator.search, **_checked_types(search))
        key = tuple(sorted(vars(wanted).items()))
        if key not in self._by_search:
            wanted.validate()
            translator = copy.copy(self.translator)
            translator.search = wanted
            self._by_search[key] = translator
        return self._by_search[key]

    def __repr__(self) -> str:
        return f"nmt.Model({str(self.run_dir)!r}, {self.source_lang}->{self.target_lang}, checkpoints={[str(c) for c in self.checkpoints]})"


def _checked_lines(text: Any) -> list[str]:
    """`text` as a list of str, or a TypeError saying what was given instead."""
    if isinstance(text, (bytes, bytearray)):
        raise TypeError("translate takes a str or a list of str, not bytes; decode it first (e.g. text.decode('utf-8'))")
    if not isinstance(text, (list, tuple)):
        raise TypeError(f"translate takes a str or a list of str, not {type(text).__name__}")
    for i, line in enumerate(text):
        if not isinstance(line, str):
            raise TypeError(f"translate takes a str or a list of str, but item {i} is a {type(line).__name__}")
    return list(text)


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
    unknown = set(settings) - SEARCH_FIELDS - TRANSLATE_FIELDS
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(sorted(unknown))}; "
                        f"use any of {', '.join(sorted(SEARCH_FIELDS | TRANSLATE_FIELDS))}")
    settings = _checked_types(settings)
    search = SearchConfig(**{k: v for k, v in settings.items() if k in SEARCH_FIELDS})
    cfg = TranslateConfig(**{k: v for k, v in settings.items() if k in TRANSLATE_FIELDS})
    if checkpoint is None:
        checkpoints: list[Union[str, Path]] = []
    elif isinstance(checkpoint, (str, Path)):
        checkpoints = [checkpoint]
    else:
        checkpoints = list(checkpoint)
    run_dir = Path(run_dir)
    translator = load_translator(run_dir, checkpoints, search, cfg)
    record = RunDir(run_dir).read_record("preprocess")
    return Model(translator, record["source_lang"], record["target_lang"], run_dir)
