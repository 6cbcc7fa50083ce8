"""Optional Moses pre- and post-processing through sacremoses (`nmt preprocess --moses`).

The classic WMT pipeline (and fairseq's prepare-wmt14en2de.sh) normalizes punctuation and
tokenizes with the Moses scripts before learning subwords. SentencePiece does not need it, so it
is off by default; when a run directory was preprocessed with it, `nmt translate` applies
`moses_preprocess` to its input and `moses_postprocess` (detokenization) to its output.

XML escaping is off (`escape=False`): the text stays plain, so `&` is not turned into `&amp;`,
and dashes are not split aggressively, so detokenization restores them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence


@lru_cache(maxsize=None)
def _tools(lang: str):
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)


def moses_preprocess(lines: Sequence[str], lang: str) -> list[str]:
    """Moses punctuation normalization then tokenization; tokens joined by single spaces."""
    normalizer, tokenizer, _ = _tools(lang)
    return [tokenizer.tokenize(normalizer.normalize(line), escape=False, return_str=True) for line in lines]


def moses_postprocess(lines: Sequence[str], lang: str) -> list[str]:
    """Undo Moses tokenization: detokenize whitespace-separated tokens into plain text."""
    _, _, detokenizer = _tools(lang)
    return [detokenizer.detokenize(line.split(), return_str=True, unescape=False) for line in lines]
