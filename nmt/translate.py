"""`nmt translate` as a library: raw lines in, one translation per line out, in order.

The data flow per buffer of `buffer_size` lines: (Moses pre-processing when the run was
preprocessed with it) -> source tokenizer -> eos appended, lines longer than the model's
positions truncated and counted -> sorted by length and cut into batches of `max_tokens`
source tokens (padding included), so padding stays small -> beam search -> input order
restored -> target tokenizer decodes -> (Moses detokenization). Lines without any token give
an empty translation without running the model. Only one buffer is held in memory, so
translation streams.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import torch

from nmt.beam_search import Hypothesis, beam_search
from nmt.checkpoint import load_checkpoint
from nmt.errors import NmtError
from nmt.identity import check_identity, checkpoint_identity, run_identity
from nmt.model import Transformer
from nmt.model_config import TransformerConfig
from nmt.rundir import RunDir
from nmt.sampling_config import SamplingConfig
from nmt.tokenizer import EOS_ID, PAD_ID, Tokenizer, load_tokenizer
from nmt.translate_config import SearchConfig, TranslateConfig

DEFAULT_CHECKPOINTS = ("checkpoint_avg.pt", "checkpoint_best.pt", "checkpoint_last.pt")


@dataclass
class Translation:
    """The answer to one input line."""

    hyp: str
    score: Optional[float]
    """Length-penalized log-probability of `hyp`; None for an empty input line."""
    nbest: list[tuple[str, float]]
    """(hypothesis, score) pairs, best first; empty for an empty input line."""


# -- checkpoints and models -------------------------------------------------------------

def default_checkpoint(run: RunDir) -> Path:
    """The averaged checkpoint if there is one, else the best, else the last."""
    for name in DEFAULT_CHECKPOINTS:
        path = run.checkpoint_dir / name
        if path.is_file():
            return path
    raise NmtError(
        f"no checkpoint to translate with in {run.checkpoint_dir} (looked for {', '.join(DEFAULT_CHECKPOINTS)}); "
        f"run `nmt train` first or pass --checkpoint"
    )


def resolve_checkpoint(run: RunDir, given: str | Path) -> Path:
    """A --checkpoint as given, else relative to the run's checkpoints/ folder."""
    path = Path(given)
    if path.is_file():
        return path
    inside = run.checkpoint_dir / path
    if not path.is_absolute() and inside.is_file():
        return inside
    raise NmtError(f"checkpoint not found: {given} (also looked in {run.checkpoint_dir})")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise NmtError(f"unknown --device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NmtError("--device cuda was asked for but PyTorch sees no GPU; use --device cpu")
    return device


def resolve_dtype(amp: str, device: torch.device) -> torch.dtype:
    if amp == "auto":
        amp = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "none"
    return {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def load_model(path: Path, device: torch.device, dtype: torch.dtype,
               expected: Optional[dict] = None) -> Transformer:
    """A Transformer from a checkpoint's configuration and weights, ready for inference;
    with `expected` (a run's `nmt.identity`), refused when trained with another vocabulary."""
    checkpoint = load_checkpoint(path)
    if expected is not None:
        check_identity(checkpoint_identity(checkpoint), expected, f"checkpoint {path}",
                       warn=lambda message: print(f"nmt translate: warning: {message}", file=sys.stderr))
    try:
        model = Transformer(TransformerConfig.from_dict(checkpoint["config"]))
        model.load_state_dict(checkpoint["model"])
    except (RuntimeError, TypeError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise NmtError(f"checkpoint {path} does not match its own model configuration ({reason}); it is damaged") from None
    return model.to(device=device, dtype=dtype).eval()


# -- the translator ---------------------------------------------------------------------

class Translator:
    """The models and tokenizers of one run directory, translating lists of raw lines."""

    def __init__(
        self,
        models: Sequence[Transformer],
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        search: SearchConfig,
        cfg: TranslateConfig,
        moses_langs: Optional[tuple[str, str]] = None,
        checkpoints: Sequence[Path] = (),
        sampling: Optional[SamplingConfig] = None,
    ):
        search.validate()
        cfg.validate()
        self.models, self.search, self.cfg = list(models), search, cfg
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.moses_langs = moses_langs
        self.checkpoints = list(checkpoints)
        self.device = next(self.models[0].parameters()).device
        self.max_positions = min(m.cfg.max_positions for m in self.models)
        self.sampling = sampling if sampling is not None and sampling.sampling else None
        """With --sampling: one draw per line (nmt.sampling) instead of the beam search."""
        self.generator = torch.Generator(self.device).manual_seed(sampling.seed) if self.sampling else None
        self.truncated = 0
        """Input lines cut to the model's positions so far."""
        self.target_tokens = 0
        """Target tokens (eos included) of the best hypotheses so far."""
        self.no_hypothesis = 0
        """Lines whose search found no hypothesis of finite score (a damaged model or an
        overflow), translated as an empty line so far."""

    def translate(self, lines: Sequence[str]) -> list[Translation]:
        """Translate one buffer of raw lines; one Translation per line, in order."""
        texts = list(lines)
        if self.moses_langs is not None:
            from nmt.moses import moses_preprocess

            texts = moses_preprocess(texts, self.moses_langs[0])
        ids = self.src_tokenizer.encode(texts)
        limit = self.max_positions - 1  # eos takes the last position
        for i, seq in enumerate(ids):
            if len(seq) > limit:
                ids[i] = seq[:limit]
                self.truncated += 1

        hyps = self._search(ids)

        flat = [h.tokens for found in hyps for h in found]
        decoded = self.tgt_tokenizer.decode(flat) if flat else []
        if self.moses_langs is not None and decoded:
            from nmt.moses import moses_postprocess

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

    def _search(self, ids: list[list[int]]) -> list[list[Hypothesis]]:
        """The best hypotheses (or one sample) of every line's token ids, in order; none for an
        empty line. Lines whose search found no finite hypothesis are counted."""
        hyps: list[list[Hypothesis]] = [[] for _ in ids]
        for batch in self._batches(ids):
            src = self._source_tensor([ids[i] for i in batch])
            for i, found in zip(batch, self._decode(src)):
                hyps[i] = found
                self.no_hypothesis += not found
        return hyps

    def _decode(self, src: torch.Tensor) -> list[list[Hypothesis]]:
        if self.sampling is not None:
            from nmt.sampling import sample

            return sample(self.models, src, self.sampling, self.search, self.generator)
        return beam_search(self.models, src, self.search)

    def _batches(self, ids: list[list[int]]) -> Iterator[list[int]]:
        """Indices of non-empty lines, longest first, in batches of at most max_tokens padded source tokens."""
        order = sorted((i for i, seq in enumerate(ids) if seq), key=lambda i: -len(ids[i]))
        batch: list[int] = []
        width = 0
        for i in order:
            n = len(ids[i]) + 1
            if batch and (len(batch) + 1) * max(width, n) > self.cfg.max_tokens:
                yield batch
                batch, width = [], 0
            batch.append(i)
            width = max(width, n)
        if batch:
            yield batch

    def _source_tensor(self, seqs: list[list[int]]) -> torch.Tensor:
        """(B, S) right-padded with pad, each sentence followed by eos."""
        width = max(len(s) for s in seqs) + 1
        src = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
        for row, seq in enumerate(seqs):
            src[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            src[row, len(seq)] = EOS_ID
        return src.to(self.device, non_blocking=True)


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
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.amp, device)
    paths = [resolve_checkpoint(run, c) for c in checkpoints] or [default_checkpoint(run)]

    tokenizers: dict[str, Tokenizer] = {}
    for lang in (src_lang, tgt_lang):
        rel = record["vocab"][lang]
        if rel not in tokenizers:
            tokenizers[rel] = load_tokenizer(run.root / rel, num_threads=cfg.threads)
    src_tok, tgt_tok = tokenizers[record["vocab"][src_lang]], tokenizers[record["vocab"][tgt_lang]]

    moses = (src_lang, tgt_lang) if record.get("moses") else None
    if cfg.engine == "ctranslate2":
        from nmt.translate_ctranslate2 import CTranslate2Translator, cached_model_dir, check_search_for_ctranslate2

        check_search_for_ctranslate2(search)
        if sampling is not None and sampling.sampling:
            raise NmtError("--sampling needs --engine nmt")
        if len(paths) > 1:
            raise NmtError("--engine ctranslate2 translates with one checkpoint; ensembles need --engine nmt")
        check_identity(checkpoint_identity(load_checkpoint(paths[0])), run_identity(run), f"checkpoint {paths[0]}",
                       warn=lambda message: print(f"nmt translate: warning: {message}", file=sys.stderr))
        model_dir = Path(cfg.ct2_model) if cfg.ct2_model else cached_model_dir(run, paths[0])[0]
        return CTranslate2Translator(model_dir, src_tok, tgt_tok, search, cfg, moses_langs=moses, checkpoints=paths)

    models = [load_model(path, device, dtype, expected=run_identity(run)) for path in paths]
    return Translator(models, src_tok, tgt_tok, search, cfg, moses_langs=moses, checkpoints=paths, sampling=sampling)
