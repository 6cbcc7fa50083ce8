"""SentencePiece BPE encoding word by word through a cache: the same ids, most words looked up."""

from __future__ import annotations

from itertools import chain
from typing import Any, Optional

import numpy as np

from nmt.data.tokenizer import PAD_ID


def flatten(ids: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, sizes) of per-sentence id lists; the loops run in C (np.fromiter over chain)."""
    sizes = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(sizes.sum()))
    return flat, sizes


class BpeWordCache:
    """SentencePiece BPE encoding, word by word through a cache (as subword-nmt and HF do).

    SentencePiece BPE pieces never cross a word boundary ("▁" only starts a piece), and merges
    inside one word do not depend on the other words, so a sentence's ids are the
    concatenation of its normalized words' ids. Natural text repeats its words (Zipf), so most
    words come from the cache and SentencePiece only sees the new ones; a chunk is normalized
    in one call with a private-use separator between lines, so no Python loop runs per line or
    per token. The first chunk is also encoded whole and compared: a vocabulary where the two
    differ (a foreign model trained with other options) falls back to whole-sentence encoding.
    The cache is bounded (`max_words`), so memory does not grow with the corpus.
    """

    SEP = "\ue000"  # a private-use character: NFKC leaves it alone and it blocks composition

    def __init__(self, sp: Any, max_words: int = 200_000):
        self.sp = sp
        self.max_words = max_words
        self.dtype: Optional[np.dtype] = None
        self.cache: dict[str, bytes] = {}
        self.verified = False
        self.usable = hasattr(sp, "normalize") and all(
            "\u2581" not in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size()))

    def encode(self, lines: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        by_words = self._encode_by_words(lines, np.dtype(dtype)) if self.usable else None
        if by_words is not None and self.verified:
            return by_words
        whole = flatten(self.sp.encode(lines, out_type=int, num_threads=1), dtype)
        if by_words is not None:
            self.verified = True
            if not (np.array_equal(by_words[0], whole[0]) and np.array_equal(by_words[1], whole[1])):
                self.usable = False
        return whole

    def _encode_by_words(self, lines: list[str], dtype: np.dtype) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """None when this chunk cannot be split safely (it holds the separator itself)."""
        sep = self.SEP
        if dtype != self.dtype:
            self.dtype, self.cache = dtype, {}
        if not lines:
            return np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.int64)
        text = sep.join(lines)
        if text.count(sep) != len(lines) - 1:
            return None
        normalized = self.sp.normalize(text)
        if normalized.count(sep) != len(lines) - 1:
            return None
        # "▁Two▁dogs<SEP>▁A▁cat" -> ["", "Two", "dogs", "", "<SEP>", "", "A", "cat"]
        tokens = normalized.replace(sep, f"\u2581{sep}\u2581").split("\u2581")
        cache = self.cache
        new = set(tokens).difference(cache)
        if new:
            if len(cache) + len(new) > self.max_words:
                cache.clear()
                new = set(tokens)
            new.discard("")
            new.discard(sep)
            # The separator becomes a pad id, which SentencePiece never emits: line ends are
            # then found with one vectorized comparison, not a loop over tokens.
            cache[""], cache[sep] = b"", np.array([PAD_ID], dtype=dtype).tobytes()
            new_words = list(new)
            ids = self.sp.encode(new_words, out_type=int, num_threads=1)
            cache.update(zip(new_words, (np.array(i, dtype=dtype).tobytes() for i in ids)))
        ids_and_ends = np.frombuffer(b"".join(map(cache.__getitem__, tokens)), dtype=dtype)
        is_end = ids_and_ends == PAD_ID
        ends = np.flatnonzero(is_end)
        sizes = np.diff(ends, prepend=-1, append=len(ids_and_ends)) - 1
        return ids_and_ends[~is_end], sizes
