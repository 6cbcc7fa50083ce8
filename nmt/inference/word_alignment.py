"""Word alignments from subword attention: the words of the raw source and of the output.

The search gives the attention of every target token over the source tokens (eos left out
and each row renormalised over the rest). Both sides are then merged into words, as users of
fast_align, awesome-align and fairseq's `--print-alignment` expect: each subword belongs to the
whitespace-separated word of the text it came from (the raw input line; the final output line),
found by matching the subwords' characters to the text's, so Moses tokenization, SentencePiece
normalisation and detokenization are all absorbed. A target word's row is the mean of its
subwords' rows; a source word's column is the sum of its subwords' columns (rows stay
distributions). The hard alignment aligns each target word to the source word it attends to
most, in Pharaoh "i-j" pairs (source word i, target word j, from 0), ordered by j.

No torch here: the CTranslate2 engine's attention goes through the same code.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

from nmt.data.tokenizer import CONTINUING_PREFIX

SPACE_MARK = "\u2581"
"""SentencePiece's and nmt's WordPiece's mark of a word start."""


def piece_surfaces(pieces: Sequence[str], special_ids: Iterable[int]) -> list[str]:
    """The text each vocabulary piece stands for (a word-start mark is a space); special
    tokens (<pad>, <unk>, <s>, </s>: `special_ids`) stand for no character."""
    special = set(special_ids)
    out = []
    for i, piece in enumerate(pieces):
        if i in special:
            out.append("")
        elif piece.startswith(CONTINUING_PREFIX) and len(piece) > len(CONTINUING_PREFIX):
            out.append(piece[len(CONTINUING_PREFIX):])
        else:
            out.append(piece.replace(SPACE_MARK, " "))
    return out


def words_of_pieces(surfaces: Sequence[str], text: str) -> list[int]:
    """For each piece (by its surface), the index of the word of `text` it belongs to.

    The non-space characters of the pieces are matched to those of the text (one to one
    when nothing changed them; else by difflib's longest matching blocks). A piece none of
    whose characters matched (an unknown token, a lone word-start mark) takes the word of
    the words the matched pieces around it skipped (`_fill_unmatched`)."""
    text_word = [w for w, word in enumerate(text.split()) for _ in word]
    if not text_word:
        return [0] * len(surfaces)
    text_chars = [c for c in text if not c.isspace()]
    piece_chars, piece_of = [], []
    for p, surface in enumerate(surfaces):
        for c in surface:
            if not c.isspace():
                piece_chars.append(c)
                piece_of.append(p)
    word: list[int | None] = [None] * len(surfaces)
    if piece_chars == text_chars:
        pairs = zip(range(len(piece_chars)), range(len(text_chars)))
    else:
        blocks = difflib.SequenceMatcher(None, piece_chars, text_chars, autojunk=False).get_matching_blocks()
        pairs = ((b.a + d, b.b + d) for b in blocks for d in range(b.size))
    for pc, tc in pairs:
        if word[piece_of[pc]] is None:
            word[piece_of[pc]] = text_word[tc]
    return _fill_unmatched(word, surfaces, len(text.split()))


def _fill_unmatched(word: list[int | None], surfaces: Sequence[str], n_words: int) -> list[int]:
    """Give each run of pieces without a matched character a word: the words the matched pieces
    around it skipped, if any (an unknown word), one per piece that starts a word; else the next
    word for a piece that starts one, the previous word for one that continues it."""
    out = list(word)
    p = 0
    while p < len(out):
        if out[p] is not None:
            p += 1
            continue
        end = p
        while end < len(out) and out[end] is None:
            end += 1
        before = out[p - 1] if p > 0 else -1
        after = out[end] if end < len(out) else n_words
        gap = list(range(before + 1, after))
        at = -1
        for q in range(p, end):
            starts = surfaces[q][:1].isspace() or q == 0
            if gap:
                at = min(at + 1, len(gap) - 1) if starts or at < 0 else at
                out[q] = gap[at]
            elif starts and after < n_words:
                out[q] = after
            else:
                out[q] = max(before, 0) if before >= 0 else min(after, n_words - 1)
        p = end
    return [int(w) for w in out]


def word_attention(attention: Sequence[Sequence[float]], src_words: Sequence[int], n_src_words: int,
                   tgt_words: Sequence[int], n_tgt_words: int) -> list[list[float]]:
    """The (target words) x (source words) matrix of subword `attention` (target tokens, eos
    row included, x source tokens without eos); each row sums to 1."""
    sums = [[0.0] * n_src_words for _ in range(n_tgt_words)]
    counts = [0] * n_tgt_words
    for row, tw in zip(attention, tgt_words):  # the eos row has no word: zip stops before it
        total = sum(row) or 1.0
        for weight, sw in zip(row, src_words):
            sums[tw][sw] += weight / total
        counts[tw] += 1
    return [[v / max(counts[j], 1) for v in sums[j]] for j in range(n_tgt_words)]


def hard_alignment(matrix: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """(source word, target word) pairs: each target word with the source word it attends to most."""
    return [(max(range(len(row)), key=row.__getitem__), j) for j, row in enumerate(matrix) if row]


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """Pairs in the Pharaoh format: "0-0 1-2 ..."."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def soft_text(matrix: Sequence[Sequence[float]]) -> str:
    """A soft alignment on one line, as Marian prints it: a target word's source weights joined
    by commas, target words separated by spaces."""
    return " ".join(",".join(f"{v:.3f}" for v in row) for row in matrix)


def align_words(attention: Sequence[Sequence[float]], src_surfaces: Sequence[str], source_text: str,
                tgt_surfaces: Sequence[str], output_text: str) -> list[list[float]]:
    """Word-level attention of one translation: `attention` over the pieces whose surfaces are
    given, merged into the words of `source_text` and `output_text`."""
    n_src, n_tgt = len(source_text.split()), len(output_text.split())
    if not n_src or not n_tgt:
        return [[] for _ in range(n_tgt)]
    return word_attention(attention, words_of_pieces(src_surfaces, source_text), n_src,
                          words_of_pieces(tgt_surfaces, output_text), n_tgt)
