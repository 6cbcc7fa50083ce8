"""`nmt translate` as a library: raw lines in, one translation per line out, in order.

The data flow per buffer of `buffer_size` lines: (Moses pre-processing when the run was
preprocessed with it) -> source tokenizer -> eos appended, lines longer than the model's
positions truncated and counted -> sorted by length and cut into batches of `max_tokens`
source tokens (padding included), so padding stays small -> beam search -> input order
restored -> target tokenizer decodes -> (Moses detokenization). Lines without any token give
an empty translation without running the model. Only one buffer is held in memory, so
translation streams.

This module never imports torch itself: with `--engine ctranslate2` on an exported model the
whole command runs without it (nmt's own engine, `nmt.inference.model_decoder`, brings it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Protocol, Sequence

from nmt.data.tokenizer import Tokenizer, load_tokenizer
from nmt.errors import NmtError
from nmt.inference.checkpoints import default_checkpoint, resolve_checkpoint
from nmt.inference.config import SearchConfig, TranslateConfig
from nmt.inference.hypothesis import Hypothesis
from nmt.inference.sampling_config import SamplingConfig
from nmt.run.directory import RunDir
from nmt.run.identity import run_identity

if TYPE_CHECKING:
    from nmt.model.transformer import Transformer

@dataclass
class Translation:
    """The answer to one input line."""

    hyp: str
    score: Optional[float]
    """Length-penalized log-probability of `hyp`; None for an empty input line."""
    nbest: list[tuple[str, float]]
    """(hypothesis, score) pairs, best first; empty for an empty input line."""


# -- decoding strategies ----------------------------------------------------------------

class Decoder(Protocol):
    """A decoding strategy: the token ids of source lines in, each line's hypotheses out."""

    max_positions: int
    """Source positions the model takes, eos included (longer lines are cut by the Translator)."""

    def decode(self, ids: list[list[int]], search: SearchConfig) -> list[list[Hypothesis]]:
        """The best hypotheses (or one sample) of every non-empty line, in order; none for an
        empty line or one whose search found no hypothesis of finite score."""
        ...


# -- the translator ---------------------------------------------------------------------

class Translator:
    """The tokenizers and decoding strategy of one run directory, translating lists of raw lines."""

    def __init__(
        self,
        decoder: Decoder | Sequence[Transformer],
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        search: SearchConfig,
        cfg: TranslateConfig,
        moses_langs: Optional[tuple[str, str]] = None,
        checkpoints: Sequence[Path] = (),
        sampling: Optional[SamplingConfig] = None,
    ):
        """`decoder` is a strategy (`ModelDecoder`, `CTranslate2Decoder`), or models to search with nmt's own."""
        search.validate()
        cfg.validate()
        if not hasattr(decoder, "decode"):
            from nmt.inference.model_decoder import ModelDecoder

            decoder = ModelDecoder(decoder, cfg.max_tokens, sampling, cfg.threads, cfg.inter_threads)
        self.decoder: Decoder = decoder
        self.search, self.cfg = search, cfg
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.moses_langs = moses_langs
        self.checkpoints = list(checkpoints)
        self.max_positions = decoder.max_positions
        self.truncated = 0
        """Input lines cut to the model's positions so far."""
        self.target_tokens = 0
        """Target tokens (eos included) of the best hypotheses so far."""
        self.no_hypothesis = 0
        """Lines whose search found no hypothesis of finite score (a damaged model or an
        overflow), translated as an empty line so far."""

    @property
    def models(self) -> list[Transformer]:
        """The torch models translating (none when another engine runs the search)."""
        return getattr(self.decoder, "models", [])

    def translate(self, lines: Sequence[str]) -> list[Translation]:
        """Translate one buffer of raw lines; one Translation per line, in order."""
        texts = list(lines)
        if self.moses_langs is not None:
            from nmt.data.moses import moses_preprocess

            texts = moses_preprocess(texts, self.moses_langs[0])
        ids = self.src_tokenizer.encode(texts)
        limit = self.max_positions - 1  # eos takes the last position
        for i, seq in enumerate(ids):
            if len(seq) > limit:
                ids[i] = seq[:limit]
                self.truncated += 1

        hyps = self.decoder.decode(ids, self.search)
        self.no_hypothesis += sum(1 for seq, found in zip(ids, hyps) if seq and not found)

        flat = [h.tokens for found in hyps for h in found]
        decoded = self.tgt_tokenizer.decode(flat) if flat else []
        if self.moses_langs is not None and decoded:
            from nmt.data.moses import moses_postprocess

            decoded = moses_postprocess(decoded, self.moses_langs[1])
        decoded_iter = iter(_one_line(t) for t in decoded)
        out = []
        for found in hyps:
            if not found:
                out.append(Translation("", None, []))
                continue
            nbest = [(next(decoded_iter), h.score) for h in found]
            self.target_tokens += len(found[0].tokens) + 1
            out.append(Translation(nbest[0][0], nbest[0][1], nbest))
        return out


def buffers(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """`lines` in lists of `size`, so input streams through a sorting window."""
    it = iter(lines)
    while buffer := list(islice(it, size)):
        yield buffer


def _one_line(text: str) -> str:
    """A translation never spans lines, whatever the vocabulary holds (any line boundary
    that str.splitlines knows, U+2028 and friends included, becomes a space)."""
    parts = text.splitlines()
    return text if len(parts) == 1 and parts[0] == text else " ".join(parts)


def load_translator(
    run_dir: str | Path,
    checkpoints: Sequence[str | Path] = (),
    search: Optional[SearchConfig] = None,
    cfg: Optional[TranslateConfig] = None,
    sampling: Optional[SamplingConfig] = None,
) -> Translator:
    """The translator of a trained run: its tokenizers, Moses setting and checkpoint(s).

    With no `checkpoints`, uses checkpoint_avg.pt, else checkpoint_best.pt, else
    checkpoint_last.pt; several checkpoints are ensembled (averaged log-probabilities).
    """
    search = search or SearchConfig()
    cfg = cfg or TranslateConfig()
    search.validate()
    cfg.validate()
    run = RunDir(Path(run_dir))
    record = run.read_record("preprocess")
    src_lang, tgt_lang = record["source_lang"], record["target_lang"]
    tokenizers: dict[str, Tokenizer] = {}
    for lang in (src_lang, tgt_lang):
        rel = record["vocab"][lang]
        if rel not in tokenizers:
            tokenizers[rel] = load_tokenizer(run.root / rel, num_threads=cfg.threads)
    src_tok, tgt_tok = tokenizers[record["vocab"][src_lang]], tokenizers[record["vocab"][tgt_lang]]
    moses = (src_lang, tgt_lang) if record.get("moses") else None

    if cfg.engine == "ctranslate2":
        decoder, paths = _ctranslate2_decoder(run, checkpoints, search, cfg, sampling, src_tok, tgt_tok)
        return Translator(decoder, src_tok, tgt_tok, search, cfg, moses_langs=moses, checkpoints=paths)

    import torch

    from nmt.device import resolve_device
    from nmt.inference.checkpoints import load_model, resolve_dtype

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.amp, device)
    paths = [resolve_checkpoint(run, c) for c in checkpoints] or [default_checkpoint(run)]
    models = [load_model(path, device, dtype, expected=run_identity(run)) for path in paths]
    return Translator(models, src_tok, tgt_tok, search, cfg, moses_langs=moses, checkpoints=paths, sampling=sampling)


def _ctranslate2_decoder(run: RunDir, checkpoints: Sequence[str | Path], search: SearchConfig, cfg: TranslateConfig,
                         sampling: Optional[SamplingConfig], src_tok: Tokenizer,
                         tgt_tok: Tokenizer) -> tuple[Decoder, list[Path]]:
    """The CTranslate2 engine on --ct2-model, or on RUN/ctranslate2/CHECKPOINT (exported first
    when missing or stale: the only step that needs torch), and the checkpoint it holds.

    The checkpoint's vocabulary is checked from the export record, which holds its identity,
    so a current export is used without loading the checkpoint.
    """
    from nmt.export.ctranslate2 import read_export_record
    from nmt.inference.ctranslate2_engine import CTranslate2Decoder, cached_model_dir, check_search_for_ctranslate2
    from nmt.run.identity import check_identity

    check_search_for_ctranslate2(search)
    if sampling is not None and sampling.sampling:
        raise NmtError("--sampling needs --engine nmt")
    if len(checkpoints) > 1:
        raise NmtError("--engine ctranslate2 translates with one checkpoint; ensembles need --engine nmt")
    if cfg.ct2_model:
        model_dir = Path(cfg.ct2_model)
        paths = [resolve_checkpoint(run, c) for c in checkpoints] or [Path(read_export_record(model_dir)["checkpoint"])]
    else:
        paths = [resolve_checkpoint(run, c) for c in checkpoints] or [default_checkpoint(run)]
        model_dir = cached_model_dir(run, paths[0])[0]
    decoder = CTranslate2Decoder(model_dir, src_tok, tgt_tok, cfg)  # first: its vocabulary check names the export
    record = decoder.record
    if "checkpoint_identity" in record:
        check_identity(record["checkpoint_identity"], run_identity(run), f"checkpoint {record['checkpoint']}",
                       warn=lambda message: print(f"nmt translate: warning: {message}", file=sys.stderr))
    return decoder, paths
