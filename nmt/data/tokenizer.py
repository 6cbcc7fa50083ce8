"""Subword tokenizers behind one small interface: SentencePiece (BPE, unigram), WordPiece, and
Marian's pair of SentencePiece models numbered by one vocab.json (`nmt import`).

Every vocabulary nmt learns uses the same special ids: pad=0, unk=1, bos=2, eos=3; an imported
Marian vocabulary has its own (eos 0, unk 1, pad last), and each tokenizer says which
(`special_ids`), which the run records and the model's configuration copies. Sources and
targets are stored without specials; the batcher appends eos (and the decoder input starts
with bos).

WordPiece (the paper's En-Fr setup, Wu et al. 2016) is HF tokenizers' WordPiece model over a
whitespace-marking pre-tokenizer (Metaspace, "▁" before each word, punctuation split off),
so decoding is exact: join the pieces, drop "##", turn "▁" back into spaces.

Both kinds decode <unk> the same way, as SentencePiece does: " ⁇ " (UNK_SURFACE), so an
unknown word stays visible in a translation instead of vanishing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Protocol, Sequence

from nmt.errors import NmtError
from nmt.model.config import BOS_ID, EOS_ID, NMT_SPECIAL_IDS, PAD_ID, UNK_ID, SpecialIds  # noqa: F401  (the ids nmt's vocabularies give them)

SPECIAL_TOKENS = ["<pad>", "<unk>", "<s>", "</s>"]
VOCAB_TYPES = ("bpe", "unigram", "wordpiece")
UNK_SURFACE = " \u2047 "
"""What <unk> decodes to: SentencePiece's own choice, " ⁇ " (U+2047), kept for WordPiece too."""
CONTINUING_PREFIX = "##"


class Tokenizer(Protocol):
    """Text <-> token ids, batched so the heavy lifting stays in C++/Rust."""

    vocab_size: int
    special_ids: SpecialIds

    def encode(self, lines: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]: ...

    def pieces(self) -> list[str]: ...


class SentencePieceTokenizer:
    """A SentencePiece model (BPE or unigram) with nmt's special ids."""

    special_ids = NMT_SPECIAL_IDS

    def __init__(self, path: str | os.PathLike, num_threads: int = 0):
        import sentencepiece as spm

        self.path = Path(path)
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.vocab_size = self.sp.get_piece_size()
        self.num_threads = num_threads if num_threads > 0 else (os.cpu_count() or 1)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(lines), out_type=int, num_threads=self.num_threads)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        # <unk> is kept: SentencePiece decodes it as UNK_SURFACE.
        return self.sp.decode([[i for i in seq if i > EOS_ID or i == UNK_ID] for seq in ids], num_threads=self.num_threads)

    def pieces(self) -> list[str]:
        """The vocabulary, in id order."""
        return [self.sp.id_to_piece(i) for i in range(self.vocab_size)]


class WordPieceTokenizer:
    """An HF tokenizers WordPiece model with nmt's special ids and exact decoding."""

    special_ids = NMT_SPECIAL_IDS

    def __init__(self, path: str | os.PathLike, num_threads: int = 0):
        from tokenizers import Tokenizer as HFTokenizer

        self.path = Path(path)
        self.tok = HFTokenizer.from_file(str(path))
        self.vocab_size = self.tok.get_vocab_size()
        self._pieces = [self.tok.id_to_token(i) for i in range(self.vocab_size)]
        self._pieces[UNK_ID] = UNK_SURFACE

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        return [enc.ids for enc in self.tok.encode_batch(list(lines), add_special_tokens=False)]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        pieces = self._pieces
        out = []
        for seq in ids:
            text = "".join(p[2:] if p.startswith(CONTINUING_PREFIX) else p
                           for p in (pieces[i] for i in seq if i > EOS_ID or i == UNK_ID))
            out.append(text.replace("▁", " ").strip())
        return out

    def pieces(self) -> list[str]:
        """The vocabulary, in id order."""
        return [self.tok.id_to_token(i) for i in range(self.vocab_size)]


MARIAN_VOCAB = "vocab.json"
"""The id table beside Marian's `source.spm` and `target.spm` (an OPUS-MT folder, `nmt import`)."""
MARIAN_SPECIALS = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}


class MarianTokenizer:
    """One side of a Marian / OPUS-MT model: its SentencePiece model (`source.spm` or
    `target.spm`) cuts text into pieces, and the `vocab.json` both sides share gives each
    piece its id; a piece missing from the table is <unk>. This is what transformers'
    MarianTokenizer does (a leading language token such as ">>fra<<", for models with
    several target languages, is kept as one piece), so ids are the ones the model was
    trained with. Marian has no <s>: its decoder starts from <pad>."""

    def __init__(self, path: str | os.PathLike, num_threads: int = 0):
        import json

        import sentencepiece as spm

        self.path = Path(path)
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        table_path = self.path.parent / MARIAN_VOCAB
        try:
            table = json.loads(table_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise NmtError(f"{table_path} is not a readable vocabulary ({type(e).__name__}); re-run `nmt import`") from None
        if not isinstance(table, dict) or sorted(table.values()) != list(range(len(table))):
            raise NmtError(f"{table_path} must map pieces to the ids 0..N-1, each once; re-run `nmt import`")
        missing = [piece for piece in MARIAN_SPECIALS.values() if piece not in table]
        if missing:
            raise NmtError(f"{table_path} has no {', '.join(missing)}; a Marian vocabulary needs </s>, <unk> and <pad>")
        self.ids = table
        self._pieces = sorted(table, key=table.__getitem__)
        self.vocab_size = len(table)
        pad = table["<pad>"]
        self.special_ids = SpecialIds(pad=pad, unk=table["<unk>"], bos=pad, eos=table["</s>"])
        self._skipped = {pad, self.special_ids.eos}
        self.num_threads = num_threads if num_threads > 0 else (os.cpu_count() or 1)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        codes, texts = zip(*(_language_code(line) for line in lines)) if lines else ((), ())
        pieces = self.sp.encode(list(texts), out_type=str, num_threads=self.num_threads)
        ids, unk = self.ids, self.special_ids.unk
        return [[ids.get(p, unk) for p in (*code, *seq)] for code, seq in zip(codes, pieces)]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        # <unk> is kept: SentencePiece decodes its own <unk> piece as UNK_SURFACE.
        # A piece of the other side's model (both share vocab.json) is not this model's, so
        # its "▁" survives decode_pieces: replaced by a space afterwards, as transformers does.
        pieces, skipped = self._pieces, self._skipped
        return [self.sp.decode_pieces([pieces[i] for i in seq if i not in skipped]).replace("▁", " ").strip()
                for seq in ids]

    def pieces(self) -> list[str]:
        """The vocabulary, in id order."""
        return list(self._pieces)


def _language_code(line: str) -> tuple[tuple[str, ...], str]:
    """(">>xx<<",), rest for a line that starts with a language token; (), line otherwise."""
    if line.startswith(">>") and (end := line.find("<<")) != -1:
        return (line[: end + 2],), line[end + 2 :]
    return (), line


def load_tokenizer(path: str | os.PathLike, num_threads: int = 0) -> Tokenizer:
    """Load a tokenizer written by `train_tokenizer` (`.model`: SentencePiece, `.json`:
    WordPiece) or by `nmt import` (`.spm` beside a `vocab.json`: Marian)."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"vocabulary not found: {path}; run `nmt preprocess` first")
    if path.suffix == ".json":
        return WordPieceTokenizer(path, num_threads)
    if path.suffix == ".spm":
        return MarianTokenizer(path, num_threads)
    return SentencePieceTokenizer(path, num_threads)


def tokenizer_filename(vocab_type: str, name: str) -> str:
    """File name of a vocabulary in `vocab/`: `joint.model`, `en.model`, `joint.json`, ..."""
    return f"{name}.json" if vocab_type == "wordpiece" else f"{name}.model"


def train_tokenizer(
    vocab_type: str,
    lines: Iterable[str],
    vocab_size: int,
    output: str | os.PathLike,
    character_coverage: float = 1.0,
    num_threads: int = 0,
    characters: Optional[set[str]] = None,
) -> Path:
    """Learn a vocabulary of `vocab_size` pieces from `lines` and write it to `output`.

    WordPiece needs the set of characters of `lines` beforehand (`text_characters`); without
    `characters`, `lines` is read into memory to find them.

    SentencePiece's "vocabulary too large" error becomes advice with the largest size the
    data supports.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    num_threads = num_threads if num_threads > 0 else (os.cpu_count() or 1)
    if vocab_type == "wordpiece":
        _train_wordpiece(lines, vocab_size, output, characters)
        return output
    if vocab_type not in ("bpe", "unigram"):
        raise NmtError(f"unknown --vocab-type {vocab_type!r}; choose one of {', '.join(VOCAB_TYPES)}")
    import sentencepiece as spm

    prefix = str(output.with_suffix(""))
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_prefix=prefix,
            model_type=vocab_type,
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece=SPECIAL_TOKENS[0],
            unk_piece=SPECIAL_TOKENS[1],
            bos_piece=SPECIAL_TOKENS[2],
            eos_piece=SPECIAL_TOKENS[3],
            num_threads=num_threads,
            input_sentence_size=0,
            max_sentence_length=1 << 16,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise NmtError(_sentencepiece_advice(str(e), vocab_size)) from None
    finally:
        vocab_file = Path(prefix + ".vocab")
        if vocab_file.exists():
            vocab_file.unlink()
    return output


def _sentencepiece_advice(msg: str, vocab_size: int) -> str:
    """Turn a SentencePiece trainer error into one line that says what to change."""
    import re

    if "Vocabulary size too high" in msg:
        m = re.search(r"value <= (\d+)", msg)
        limit = f" (at most {m.group(1)} for this data)" if m else ""
        return (f"--vocab-size {vocab_size} is more than this training data supports{limit}; "
                f"choose a smaller --vocab-size or use more data")
    if "smaller than required_chars" in msg:
        m = re.search(r"(\d+) vs (\d+)", msg)
        need = f" (the data has {int(m.group(2)) - len(SPECIAL_TOKENS)} characters to cover, plus {len(SPECIAL_TOKENS)} special tokens: at least {m.group(2)})" if m else ""
        return (f"--vocab-size {vocab_size} is too small for the characters of this data{need}; "
                f"choose a larger --vocab-size or lower --character-coverage")
    if "sentences_.empty()" in msg:
        return "no training sentences to learn a vocabulary from; check --trainpref"
    last = msg.strip().splitlines()[-1] if msg.strip() else "unknown error"
    return f"SentencePiece could not learn a vocabulary: {last}"


def text_characters(lines: Iterable[str]) -> set[str]:
    """The characters of `lines` after NFKC (WordPiece's normalizer), newlines and spaces aside."""
    import unicodedata
    from itertools import islice

    chars: set[str] = set()
    it = iter(lines)
    while block := list(islice(it, 100_000)):  # one C-speed pass per block, not per line
        chars.update(unicodedata.normalize("NFKC", "\n".join(block)))
    chars.discard("\n")
    chars.discard(" ")
    return chars


def _train_wordpiece(lines: Iterable[str], vocab_size: int, output: Path,
                     characters: Optional[set[str]] = None) -> None:
    """Learn a WordPiece vocabulary with HF tokenizers, deterministically.

    HF's trainer (BPE underneath, `WordPiece.from_bpe`) gives continuation pieces ("##e") ids
    in the iteration order of a hash map of words, which changes from process to process;
    those ids break ties between merges of equal counts, so the learned vocabulary changed
    from run to run (huggingface/tokenizers#1794). The trainer gives the ids of the special
    tokens and the (sorted) alphabet deterministically, so every continuation piece of the
    data's characters is declared up front as a "special" token in sorted order, then turned
    back into an ordinary vocabulary entry in the saved file. A continuation piece of a
    character that only ever starts words takes a slot unused; there are few.
    """
    import json

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    if characters is None:
        lines = list(lines)
        characters = text_characters(lines)
    continuations = [CONTINUING_PREFIX + c for c in sorted(characters)]
    tok = HFTokenizer(models.WordPiece(unk_token=SPECIAL_TOKENS[UNK_ID], max_input_chars_per_word=100))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"), pre_tokenizers.Punctuation()]
    )
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + continuations,
                                        continuing_subword_prefix=CONTINUING_PREFIX, show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    n_learned = tok.get_vocab_size()
    if n_learned == len(SPECIAL_TOKENS) + len(continuations):
        raise NmtError("no training sentences to learn a vocabulary from; check --trainpref")
    if n_learned > vocab_size:
        # The trainer always keeps every character of the data (the initial alphabet).
        raise NmtError(
            f"--vocab-size {vocab_size} is too small for the characters of this data "
            f"(WordPiece needs at least {n_learned} pieces); choose a larger --vocab-size"
        )
    if n_learned < vocab_size:
        raise NmtError(
            f"--vocab-size {vocab_size} is more than this training data supports "
            f"(WordPiece found only {n_learned} pieces); choose a smaller --vocab-size"
        )
    # The continuation pieces become ordinary pieces again: not matched in raw text, not special.
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIAL_TOKENS]
    HFTokenizer.from_str(json.dumps(spec, ensure_ascii=False)).save(str(output))
