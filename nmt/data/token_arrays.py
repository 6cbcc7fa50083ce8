"""Binarized corpora: one flat memory-mapped array of token ids plus offsets, per split and side.

    data/{split}.{lang}.bin   token ids, no specials, uint16 when the vocabulary fits, else int32
    data/{split}.{lang}.idx   int64 offsets, n+1 of them (sentence i is bin[idx[i]:idx[i+1]])

Like nanoGPT's np.memmap files: the OS pages data in on demand, so memory stays flat however
large the corpus.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nmt.errors import NmtError


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype that holds every id of the vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def split_paths(data_dir: str | Path, split: str, lang: str) -> tuple[Path, Path]:
    """(bin, idx) paths of one split and side."""
    data_dir = Path(data_dir)
    return data_dir / f"{split}.{lang}.bin", data_dir / f"{split}.{lang}.idx"


class TokenArray:
    """Read-only view of one binarized split side: `arr[i]` is sentence i's ids (np array)."""

    def __init__(self, data_dir: str | Path, split: str, lang: str, dtype: np.dtype | str):
        bin_path, idx_path = split_paths(data_dir, split, lang)
        for p in (bin_path, idx_path):
            if not p.is_file():
                raise NmtError(f"binarized data missing: {p}; run `nmt preprocess` first")
        # Offsets stay on disk too: 8 bytes a sentence is 36 MB per side at WMT's 4.5M pairs.
        self.offsets = np.memmap(idx_path, dtype=np.int64, mode="r") if idx_path.stat().st_size else np.zeros(0, np.int64)
        n_tokens = int(self.offsets[-1]) if len(self.offsets) else 0
        dtype = np.dtype(dtype)
        expected = n_tokens * dtype.itemsize
        if bin_path.stat().st_size != expected:
            raise NmtError(f"{bin_path} is damaged ({bin_path.stat().st_size} bytes, expected {expected}); re-run `nmt preprocess --force`")
        self.tokens = np.memmap(bin_path, dtype=dtype, mode="r") if n_tokens else np.zeros(0, dtype=dtype)
        self.sizes = np.diff(self.offsets).astype(np.int32)
        """Tokens per sentence (no eos/bos); int32 halves what every training process holds."""

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


class TokenArrayWriter:
    """Append sentences' ids to a split side, streaming both files; `close()` finishes them.

    Offsets are written as they come rather than kept in memory, so memory stays flat however
    many sentences a split has.
    """

    def __init__(self, bin_path: Path, idx_path: Path, dtype: np.dtype):
        self.bin_path, self.idx_path, self.dtype = Path(bin_path), Path(idx_path), np.dtype(dtype)
        self._bin = open(self.bin_path, "wb")
        self._idx = open(self.idx_path, "wb")
        self._idx.write(np.zeros(1, dtype=np.int64).tobytes())
        self._total = 0

    def add(self, flat: np.ndarray, sizes: np.ndarray) -> None:
        """Append a block of sentences given as concatenated ids and per-sentence sizes."""
        flat = np.ascontiguousarray(flat, dtype=self.dtype)
        ends = np.cumsum(sizes, dtype=np.int64) + self._total
        if (int(ends[-1]) if len(ends) else self._total) != self._total + len(flat):
            raise ValueError(f"sizes add up to {int(ends[-1]) - self._total if len(ends) else 0} tokens, but {len(flat)} ids were given")
        self._bin.write(flat.tobytes())
        self._idx.write(ends.tobytes())
        self._total += len(flat)

    def close(self) -> None:
        self._bin.close()
        self._idx.close()

    def __enter__(self) -> "TokenArrayWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
