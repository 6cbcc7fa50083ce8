"""`nmt translate` as a library: raw lines in, one translation per line out, in order.

The data flow per buffer of `buffer_size` lines: (Moses pre-processing when the run was
preprocessed with it) -> source tokenizer -> eos appended, lines longer than the model's
positions truncated and counted -> sorted by length and cut into batches of `max_tokens`
source tokens (padding included), so padding stays small -> beam search -> input order
restored -> target tokenizer decodes -> (Moses detokenization). Lines without any token give
an empty translation without running the model (whatever prefix or constraints they carry).
Only one buffer is held in memory, so translation streams.

A line may carry a target prefix and constraint phrases (raw text, tokenized here as the
target side is: Moses first when the run uses it); with `alignment`, each translation also
gets its word alignment (`nmt.inference.word_alignment`).

This module never imports torch itself: with `--engine ctranslate2` on an exported model the
whole command runs without it (nmt's own engine, `nmt.inference.model_decoder`, brings it).
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Protocol, Sequence, Union

from nmt.data.tokenizer import UNK_SURFACE, Tokenizer, load_tokenizer
from nmt.errors import NmtError
from nmt.run.checkpoint_choice import default_checkpoint, resolve_checkpoint
from nmt.inference.config import AlignmentConfig, SearchConfig, TranslateConfig
from nmt.inference.hypothesis import Hypothesis, TargetRequest
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
    alignment: Union[None, str, list[list[float]]] = None
    """When asked for: the word alignment of `hyp` to the input line, Pharaoh "i-j" pairs
    (hard) or the (output words x input words) attention matrix (soft); "" or [] for an empty line."""


# -- decoding strategies ----------------------------------------------------------------

class Decoder(Protocol):
    """A decoding strategy: the token ids of source lines in, each line's hypotheses out."""

    max_positions: int
    """Source positions the model takes, eos included (longer lines are cut by the Translator)."""
    decoder_layers: int
    """Layers of the model's decoder (an alignment layer is one of them)."""
    constrains: bool
    """Whether it searches with constraints."""
    max_tokens: int
    """Source tokens per batch it searches (--max-tokens, or what 0 means for it)."""
    path: str
    """What searches: "native" or "stock" (nmt's decoder step, `nmt.ops.optimize_for`), or "ctranslate2"."""

    def decode(self, ids: list[list[int]], search: SearchConfig, requests: Optional[Sequence[TargetRequest]] = None,
               alignment_layer: Optional[int] = None) -> list[list[Hypothesis]]:
        """The best hypotheses (or one sample) of every non-empty line, in order; none for an
        empty line or one whose search found no hypothesis of finite score. `requests` gives
        lines a prefix or constraints; with `alignment_layer` the best hypothesis of each line
        gets that decoder layer's `attention`."""
        ...


# -- the translator ---------------------------------------------------------------------

DECODER_PATHS = {"native": "nmt's C++ kernels (fp32 CPU)", "stock": "PyTorch's ops", "ctranslate2": "CTranslate2"}
"""Each decoding path, as `nmt translate`, `/info` and `nmt.load` name it."""


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
        alignment: Optional[AlignmentConfig] = None,
    ):
        """`decoder` is a strategy (`ModelDecoder`, `CTranslate2Decoder`), or models to search with nmt's own."""
        search.validate()
        cfg.validate()
        if alignment is not None and alignment.print_alignment:
            alignment.validate()
        else:
            alignment = None
        if not hasattr(decoder, "decode"):
            from nmt.inference.model_decoder import ModelDecoder

            decoder = ModelDecoder(decoder, cfg.batch_tokens(), sampling, cfg.threads, cfg.inter_threads)
        self.decoder: Decoder = decoder
        self.search, self.cfg = search, cfg
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.moses_langs = moses_langs
        self.checkpoints = list(checkpoints)
        self.max_positions = decoder.max_positions
        self.alignment = alignment
        """Word alignments asked for (None: none)."""
        self.alignment_layer = alignment.layer_of(decoder.decoder_layers) if alignment is not None else None
        self._surfaces: Optional[tuple[list[str], list[str]]] = None
        """Each vocabulary piece's text, source and target side (word alignments)."""
        self.truncated = 0
        """Input lines cut to the model's positions so far."""
        self.target_tokens = 0
        """Target tokens (eos included) of the best hypotheses so far."""
        self.no_hypothesis = 0
        """Lines whose search found no hypothesis of finite score (a damaged model or an
        overflow), translated as an empty line so far."""
        self.decoder_path = decoder.path
        """The decoding path that runs (DECODER_PATHS)."""
        self.unmet_constraints = 0
        """Lines whose translation misses one of its constraint phrases (it reached the length
        limit first) so far."""
        self.unknown_constraints = 0
        """Constraint phrases with characters the target vocabulary lacks so far: <unk> stands
        in for them, so the search "meets" such a phrase with " ⁇ " (the first is named on stderr)."""

    @property
    def models(self) -> list[Transformer]:
        """The torch models translating (none when another engine runs the search)."""
        return getattr(self.decoder, "models", [])

    def translate(self, lines: Sequence[str], prefixes: Optional[Sequence[str]] = None,
                  constraints: Optional[Sequence[Sequence[str]]] = None, first_line: int = 1) -> list[Translation]:
        """Translate one buffer of raw lines; one Translation per line, in order. `prefixes`
        (one per line, "" for none) and `constraints` (phrases per line) are raw target text;
        `first_line` numbers the lines in error messages."""
        ids, cut = self._source_ids(lines)
        self.truncated += cut
        requests = self._requests(ids, prefixes, constraints, first_line)

        hyps = self.decoder.decode(ids, self.search, requests, self.alignment_layer)
        self.no_hypothesis += sum(1 for seq, found in zip(ids, hyps) if seq and not found)
        if requests is not None:
            self.unmet_constraints += sum(1 for r, found in zip(requests, hyps)
                                          if found and not all(_contains(found[0].tokens, c) for c in r.constraints))
            self._count_unknown_constraints(requests, constraints, first_line)

        flat = [h.tokens for found in hyps for h in found]
        decoded = self.tgt_tokenizer.decode(flat) if flat else []
        if self.moses_langs is not None and decoded:
            from nmt.data.moses import moses_postprocess

            decoded = moses_postprocess(decoded, self.moses_langs[1])
        decoded_iter = iter(_one_line(t) for t in decoded)
        out = []
        for line, seq, found in zip(lines, ids, hyps):
            if not found:
                out.append(Translation("", None, [], self._alignment(None, line, [], "")))
                continue
            nbest = [(next(decoded_iter), h.score) for h in found]
            self.target_tokens += len(found[0].tokens) + 1
            best = found[0]
            out.append(Translation(nbest[0][0], nbest[0][1], nbest, self._alignment(best.attention, line, seq, nbest[0][0], best.tokens)))
        return out

    def check_requests(self, lines: Sequence[str], prefixes: Optional[Sequence[str]],
                       constraints: Optional[Sequence[Sequence[str]]]) -> None:
        """The NmtError `translate` would raise for these prefixes and constraints, without translating."""
        requests = self._requests(self._source_ids(lines)[0], prefixes, constraints, 1)
        if requests is not None and any(r.constraints for r in requests) and not self.decoder.constrains:
            raise NmtError("this engine has no constrained search; translate with constraints on --engine nmt")

    def fits(self, lines: Sequence[str]) -> list[bool]:
        """Whether each raw line fits the model's positions (a longer one is translated cut)."""
        limit = self.max_positions - 1
        return [len(seq) <= limit for seq in self._encode(list(lines), side=0)]

    def _source_ids(self, lines: Sequence[str]) -> tuple[list[list[int]], int]:
        """The source ids of raw lines, cut to the model's positions, and how many were cut."""
        ids = self._encode(list(lines), side=0)
        limit = self.max_positions - 1  # eos takes the last position
        cut = sum(1 for seq in ids if len(seq) > limit)
        return [seq[:limit] for seq in ids] if cut else ids, cut

    def _requests(self, ids: list[list[int]], prefixes: Optional[Sequence[str]], constraints: Optional[Sequence[Sequence[str]]],
                  first_line: int) -> Optional[list[TargetRequest]]:
        """Each line's prefix and constraint phrases in target ids, or an NmtError naming a line
        whose prefix and phrases cannot fit its output length limit."""
        if not prefixes and not constraints:
            return None
        n = len(ids)
        for name, given in (("prefixes", prefixes), ("constraints", constraints)):
            if given is not None and len(given) != n:
                raise NmtError(f"{len(given)} {name} for {n} lines; give one per line")
        phrases = [[p for p in line_phrases if p.strip()] for line_phrases in (constraints or [[]] * n)]
        if not any(phrases) and not any(p.strip() for p in prefixes or ()):
            return None  # `--constraints` on lines without phrases: the plain search, no extra work
        prefix_ids = self._target_ids(list(prefixes)) if prefixes else [[] for _ in range(n)]
        flat = self._target_ids([p for line_phrases in phrases for p in line_phrases])
        requests, at = [], 0
        for i, (seq, prefix) in enumerate(zip(ids, prefix_ids)):
            line_ids = tuple(tuple(flat[at + j]) for j in range(len(phrases[i])))
            at += len(phrases[i])
            request = TargetRequest(tuple(prefix), tuple(c for c in line_ids if c))
            if seq and request:
                room = self.search.max_output_length(len(seq), self.max_positions)
                need = len(request.prefix) + sum(map(len, request.constraints))
                if need > room:
                    what = " and ".join(n for n, v in (("prefix", request.prefix), ("constraints", request.constraints)) if v)
                    raise NmtError(f"line {first_line + i}: its {what} {'takes' if what == 'prefix' else 'take'} {need} target tokens, more than "
                                   f"the {room} its {len(seq)}-token source may have (--max-len-a {self.search.max_len_a:g} "
                                   f"--max-len-b {self.search.max_len_b}); shorten them or raise --max-len-b")
            requests.append(request)
        return requests

    def _count_unknown_constraints(self, requests: list[TargetRequest], constraints: Optional[Sequence[Sequence[str]]],
                                   first_line: int) -> None:
        """Count the constraint phrases that encode to <unk> somewhere, and name the first one
        on stderr: "Äste" without "Ä" in the vocabulary was silently met by " ⁇ ste"."""
        unk = self.tgt_tokenizer.special_ids.unk
        lines = [i for i, r in enumerate(requests) for phrase in r.constraints if unk in phrase]
        if lines and not self.unknown_constraints:
            i = lines[0]
            text = next(p for p in constraints[i] if unk in self._target_ids([p])[0])
            print(f"nmt translate: warning: line {first_line + i}: constraint {text!r} has characters the target "
                  f"vocabulary lacks; <unk> stands in for them, so the translation holds \"{UNK_SURFACE.strip()}\" "
                  f"instead (further such phrases are only counted)", file=sys.stderr)
        self.unknown_constraints += len(lines)

    def _target_ids(self, texts: list[str]) -> list[list[int]]:
        """Raw target text (prefixes, phrases) as the model's target ids."""
        return self._encode(texts, side=1)

    def _encode(self, texts: list[str], side: int) -> list[list[int]]:
        """Raw text of the source (side 0) or target (side 1) as ids, Moses-tokenized first when the run is."""
        if not texts:
            return []
        if self.moses_langs is not None:
            from nmt.data.moses import moses_preprocess

            texts = moses_preprocess(texts, self.moses_langs[side])
        return (self.src_tokenizer, self.tgt_tokenizer)[side].encode(texts)

    def _alignment(self, attention: Optional[list[list[float]]], source: str, src_ids: Sequence[int], output: str,
                   tgt_ids: Sequence[int] = ()) -> Union[None, str, list[list[float]]]:
        """The word alignment of one translation in the asked format (None when not asked)."""
        if self.alignment is None:
            return None
        from nmt.inference import word_alignment as wa

        hard = self.alignment.alignment_format == "hard"
        if attention is None:
            return "" if hard else []
        if self._surfaces is None:
            self._surfaces = tuple(wa.piece_surfaces(tok.pieces(), tok.special_ids) for tok in (self.src_tokenizer, self.tgt_tokenizer))
        src_surfaces, tgt_surfaces = self._surfaces
        matrix = wa.align_words(attention, [src_surfaces[t] for t in src_ids], source,
                                [tgt_surfaces[t] for t in tgt_ids], output)
        return wa.pharaoh(wa.hard_alignment(matrix)) if hard else matrix


def buffers(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """`lines` in lists of `size`, so input streams through a sorting window."""
    it = iter(lines)
    while buffer := list(islice(it, size)):
        yield buffer


def _contains(tokens: Sequence[int], phrase: Sequence[int]) -> bool:
    """Whether `phrase` occurs in `tokens` as a contiguous run."""
    n = len(phrase)
    return any(list(tokens[i : i + n]) == list(phrase) for i in range(len(tokens) - n + 1))


def _one_line(text: str) -> str:
    """A translation never spans lines, whatever the vocabulary holds (any line boundary
    that str.splitlines knows, U+2028 and friends included, becomes a space)."""
    parts = text.splitlines()
    return text if len(parts) == 1 and parts[0] == text else " ".join(parts)


def freeze_loaded_objects() -> None:
    """Take everything loaded so far (models, tokenizers) out of the cyclic garbage collector's
    scans, for a process that translates until it exits (`nmt translate`, and the benches that
    time it): those objects live as long as it does, and re-scanning them took a few percent of
    a CPU decoder run. A library user's process keeps its collector as is."""
    gc.collect()
    gc.freeze()


def load_translator(
    run_dir: str | Path,
    checkpoints: Sequence[str | Path] = (),
    search: Optional[SearchConfig] = None,
    cfg: Optional[TranslateConfig] = None,
    sampling: Optional[SamplingConfig] = None,
    alignment: Optional[AlignmentConfig] = None,
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
        if alignment is not None and alignment.print_alignment:
            decoder.check_alignment_layer(alignment.layer_of(decoder.decoder_layers))
        return Translator(decoder, src_tok, tgt_tok, search, cfg, moses_langs=moses, checkpoints=paths, alignment=alignment)

    import torch

    from nmt.device import resolve_device
    from nmt.inference.checkpoints import load_model, resolve_dtype

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.amp, device)
    paths = [resolve_checkpoint(run, c) for c in checkpoints] or [default_checkpoint(run)]
    models = [load_model(path, device, dtype, expected=run_identity(run), decoder=cfg.decoder) for path in paths]
    return Translator(models, src_tok, tgt_tok, search, cfg, moses_langs=moses, checkpoints=paths, sampling=sampling,
                      alignment=alignment)


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
