"""Which vocabulary a model was trained with: a checkpoint's identity against a run directory's.

Vocabulary sizes alone do not tell two vocabularies apart: `preprocess --force` from en-de to
en-fr at the same --vocab-size, or another run's checkpoint with `translate -c`, load without
complaint and give garbage, because token 1234 means another piece. The identity names the
vocabulary itself:

    {"source_lang": "en", "target_lang": "de",
     "vocab_sha256": {"en": "<hex>", "de": "<hex>"},   # of each side's pieces, in id order
     "vocab_sizes": {"en": 8000, "de": 8000}}

`nmt preprocess` records the hashes in config/preprocess.json; runs preprocessed before that
hash their vocabularies on demand. Training stores the identity in every checkpoint under
"identity", and `nmt export` in nmt_export.json (checked by `translate --engine ctranslate2`).
Checkpoints written before identities existed carry only sizes (in their model
configuration): those are compared and a warning says the vocabulary itself could not be.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Optional

from nmt.errors import NmtError
from nmt.run.directory import RunDir

IDENTITY_KEY = "identity"


def vocab_sha256(path: Path) -> str:
    """Hex sha256 of a vocabulary's pieces in id order: what a token id means.

    Not of the file: a SentencePiece model also records the path it was trained at, so the
    same vocabulary learned in two folders would differ, and a copy would still match.
    """
    from nmt.data.tokenizer import load_tokenizer

    return tokenizer_sha256(load_tokenizer(path, num_threads=1))


def tokenizer_sha256(tokenizer: Any) -> str:
    """`vocab_sha256` of a loaded tokenizer (an `nmt.data.tokenizer.Tokenizer`)."""
    h = hashlib.sha256()
    for piece in tokenizer.pieces():
        h.update(piece.encode("utf-8") + b"\n")
    return h.hexdigest()


def vocab_hashes(root: Path, vocab: dict[str, str]) -> dict[str, str]:
    """{lang: vocab_sha256 of its tokenizer file} for a record's {lang: relative path}."""
    return {lang: vocab_sha256(Path(root) / rel) for lang, rel in vocab.items()}


def run_identity(rd: RunDir) -> dict[str, Any]:
    """The identity of the vocabulary a run directory's data was made with."""
    record = rd.read_record("preprocess")
    hashes = record.get("vocab_sha256")
    if not hashes:  # preprocessed before the hash was recorded
        hashes = vocab_hashes(rd.root, record["vocab"])
    src, tgt = record["source_lang"], record["target_lang"]
    return {
        "source_lang": src,
        "target_lang": tgt,
        "vocab_sha256": {src: hashes[src], tgt: hashes[tgt]},
        "vocab_sizes": {src: int(record["vocab_sizes"][src]), tgt: int(record["vocab_sizes"][tgt])},
    }


def checkpoint_identity(checkpoint: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The identity a checkpoint carries; for an older one, what its configuration tells
    (vocabulary sizes by side, no hashes); None when it tells nothing."""
    identity = checkpoint.get(IDENTITY_KEY)
    if isinstance(identity, dict):
        return identity
    config = checkpoint.get("config") or {}
    if "src_vocab_size" in config and "tgt_vocab_size" in config:
        return {"side_sizes": (int(config["src_vocab_size"]), int(config["tgt_vocab_size"]))}
    return None


def _side_sizes(identity: dict[str, Any]) -> tuple[int, int]:
    if "side_sizes" in identity:
        return tuple(identity["side_sizes"])  # type: ignore[return-value]
    sizes = identity["vocab_sizes"]
    return int(sizes[identity["source_lang"]]), int(sizes[identity["target_lang"]])


def _short(h: str) -> str:
    return h[:12]


def identity_difference(a: dict[str, Any], b: dict[str, Any]) -> Optional[str]:
    """What differs between two identities, as 'A vs B' text; None when they agree.

    Full identities are compared by languages and hashes; when either lacks hashes (an older
    checkpoint), only the sizes of the source and target vocabularies can be compared.
    """
    if "vocab_sha256" in a and "vocab_sha256" in b:
        pair_a, pair_b = (a["source_lang"], a["target_lang"]), (b["source_lang"], b["target_lang"])
        if pair_a != pair_b:
            return f"languages {'-'.join(pair_a)} vs {'-'.join(pair_b)}"
        for side, lang in (("source", pair_a[0]), ("target", pair_a[1])):
            ha, hb = a["vocab_sha256"][lang], b["vocab_sha256"][lang]
            if ha != hb:
                return f"{side} ({lang}) vocabulary sha256 {_short(ha)}... vs {_short(hb)}..."
        return None
    (sa, ta), (sb, tb) = _side_sizes(a), _side_sizes(b)
    if (sa, ta) != (sb, tb):
        return f"vocabulary sizes {sa}/{ta} vs {sb}/{tb} (source/target)"
    return None


def check_identity(ckpt_identity: Optional[dict[str, Any]], run_identity: dict[str, Any], what: str,
                   warn: Callable[[str], None]) -> None:
    """Refuse `what` (e.g. "checkpoint X") when it was trained with another vocabulary than the run's.

    One line saying what the checkpoint has vs the run directory; for an older checkpoint
    without an identity, the sizes are compared and `warn` says the vocabulary was not.
    """
    if ckpt_identity is None:
        warn(f"{what} records neither its vocabulary nor its size; cannot check that it fits this run directory")
        return
    difference = identity_difference(ckpt_identity, run_identity)
    if difference is not None:
        raise NmtError(f"{what} was trained with another vocabulary than this run directory has "
                       f"({difference}, checkpoint vs run); use the run directory it was trained in")
    if "vocab_sha256" not in ckpt_identity:
        warn(f"{what} predates vocabulary identities: only its vocabulary sizes could be checked against this "
             f"run directory, not which vocabulary it is")
