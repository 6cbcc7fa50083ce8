"""`nmt translate --engine ctranslate2`: the same lines-in, lines-out contract as `nmt
translate` (tokenizers, Moses, truncation, empty lines, n-best: `Translator`), with the
search done by CTranslate2 on an exported model (nmt.export_ctranslate2).

CTranslate2's beam search is fairseq's rule (k alive from 2k candidates, stop when k have
finished: `patience=1`) with the |Y|^alpha penalty, so it is nmt's `--beam-style fairseq
--lenpen-style avg`; other settings are refused rather than silently changed. To match nmt:
|Y| counts eos (`return_end_token=True`), an empty translation is allowed
(`min_decoding_length=0`), pad and bos are never generated (`suppress_sequences`), and each
sentence gets its own length limit a * |X| + b: sentences are sent in groups of one source
length, since `max_decoding_length` is one number per call. One difference stays: at its
length limit CTranslate2 ends a hypothesis with whatever token comes, nmt forces eos there.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

from nmt.beam_search import Hypothesis
from nmt.errors import NmtError
from nmt.export_ctranslate2 import EXPORT_RECORD, export_ctranslate2, import_ctranslate2, vocabulary_tokens
from nmt.rundir import RunDir
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from nmt.translate import Translator
from nmt.translate_config import SearchConfig, TranslateConfig


def check_search_for_ctranslate2(search: SearchConfig) -> None:
    """CTranslate2 has one search rule and one length penalty; anything else is refused."""
    if search.lenpen_style != "avg":
        raise NmtError(f"--engine ctranslate2 has only the |Y|^alpha length penalty, not --lenpen-style {search.lenpen_style}; "
                       f"pass --lenpen-style avg (and --beam-style fairseq)")
    if search.beam_style != "fairseq":
        raise NmtError(f"--engine ctranslate2 searches with the fairseq rule only, not --beam-style {search.beam_style}; "
                       f"pass --beam-style fairseq")


def cached_model_dir(run: RunDir, checkpoint: Path) -> tuple[Path, bool]:
    """RUN/ctranslate2/CHECKPOINT-STEM, exported now if missing or older than the checkpoint;
    returns (directory, whether it was exported now)."""
    model_dir = run.root / "ctranslate2" / checkpoint.stem
    model_bin = model_dir / "model.bin"
    if model_bin.is_file() and model_bin.stat().st_mtime >= checkpoint.stat().st_mtime:
        return model_dir, False
    return export_ctranslate2(run.root, model_dir, checkpoint=checkpoint, force=True), True


class CTranslate2Translator(Translator):
    """A `Translator` whose search runs in CTranslate2."""

    def __init__(self, model_dir: Path, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, search: SearchConfig,
                 cfg: TranslateConfig, moses_langs: Optional[tuple[str, str]] = None, checkpoints: Sequence[Path] = ()):
        search.validate()
        cfg.validate()
        check_search_for_ctranslate2(search)
        ctranslate2 = import_ctranslate2()
        record_file = Path(model_dir) / EXPORT_RECORD
        if not record_file.is_file():
            raise NmtError(f"{model_dir} is not a model written by `nmt export --format ctranslate2` (no {EXPORT_RECORD})")
        record = json.loads(record_file.read_text(encoding="utf-8"))
        self.models, self.search, self.cfg = [], search, cfg
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.moses_langs = moses_langs
        self.checkpoints = list(checkpoints)
        self.model_dir = Path(model_dir)
        self.max_positions = int(record["max_positions"])
        self.truncated = 0
        self.no_hypothesis = 0
        self.target_tokens = 0
        device = cfg.device.split(":")[0]
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        index = int(cfg.device.split(":")[1]) if ":" in cfg.device else 0
        try:
            self.engine = ctranslate2.Translator(str(model_dir), device=device, device_index=index,
                                                 compute_type=cfg.ct2_compute_type, inter_threads=1, intra_threads=cfg.threads)
        except (RuntimeError, ValueError) as e:
            raise NmtError(f"CTranslate2 cannot load {model_dir} ({str(e).splitlines()[0]})") from None
        self.src_pieces = vocabulary_tokens(src_tokenizer)
        tgt_pieces = vocabulary_tokens(tgt_tokenizer)
        self.tgt_ids = {piece: i for i, piece in enumerate(tgt_pieces)}
        self.suppress = [[tgt_pieces[PAD_ID]], [tgt_pieces[BOS_ID]]]
        self.eos_piece = tgt_pieces[EOS_ID]

    def _search(self, ids: list[list[int]]) -> list[list[Hypothesis]]:
        search = self.search
        hyps: list[list[Hypothesis]] = [[] for _ in ids]
        by_length: dict[int, list[int]] = {}
        for i, seq in enumerate(ids):
            if seq:
                by_length.setdefault(len(seq), []).append(i)
        for n, group in sorted(by_length.items(), reverse=True):
            max_len = min(max(math.floor(search.max_len_a * n + search.max_len_b), 0), self.max_positions - 1)
            results = self.engine.translate_batch(
                [[self.src_pieces[t] for t in ids[i]] for i in group],
                max_batch_size=max(1, self.cfg.max_tokens // (n + 1)), beam_size=search.beam, patience=1,
                length_penalty=search.lenpen, num_hypotheses=search.nbest, return_scores=True, return_end_token=True,
                min_decoding_length=0, max_decoding_length=max_len + 1, suppress_sequences=self.suppress,
            )
            for i, result in zip(group, results):
                found = []
                for pieces, score in zip(result.hypotheses, result.scores):
                    length = len(pieces)  # eos included, as nmt counts |Y|
                    if pieces and pieces[-1] == self.eos_piece:
                        pieces = pieces[:-1]
                    found.append(Hypothesis([self.tgt_ids[p] for p in pieces], score, score * length**search.lenpen))
                hyps[i] = found
        return hyps
