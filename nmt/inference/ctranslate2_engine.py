"""`nmt translate --engine ctranslate2`: a decoding strategy of the `Translator` (which keeps
the lines-in, lines-out contract: tokenizers, Moses, truncation, empty lines, n-best), with the
search done by CTranslate2 on an exported model (nmt.export.ctranslate2). Nothing here imports
torch: on a current export, the command runs on CTranslate2 and SentencePiece alone, with one
OpenMP runtime in the process (torch's and CTranslate2's, together, fight over the cores).

CTranslate2's beam search is fairseq's rule (k alive from 2k candidates, stop when k have
finished: `patience=1`) with the |Y|^alpha penalty, so it is nmt's `--beam-style fairseq
--lenpen-style avg`; other settings are refused rather than silently changed. To match nmt:
|Y| counts eos (`return_end_token=True`), an empty translation is allowed
(`min_decoding_length=0`), pad and bos are never generated (`suppress_sequences`).

Length limits. nmt gives each sentence its own limit a * |X| + b, CTranslate2 one
`max_decoding_length` per call. All lines go into one call (CTranslate2 then batches them by
tokens, as its users run it) with the largest limit M. A sentence whose search stopped before
its own limit L searched exactly as it would have with L: the steps before L do not depend on
the limit. That is told by the hypotheses: the search stops at the step where the k-th
hypothesis finishes, so with all k asked for (`num_hypotheses=beam`; with a length penalty the
stopping rule does not depend on it), the longest one ended at the last step. Only the
sentences whose longest hypothesis reaches L (and L < M) are searched again, grouped by
limit: on a trained model a handful or none.

L counts the tokens before eos; nmt forces eos after them. CTranslate2's `max_decoding_length`
counts every generated token, eos included, and its last step ends a hypothesis with whatever
token comes (src/decoding.cc, `is_last_step`). So the engine asks for L steps: a hypothesis
that took all L without eos is one nmt ends with a forced eos, and it is scored as nmt scores
it (`score_batch`: log P with eos's, |Y| with eos) before the hypotheses are ranked. A limit of
0 (which CTranslate2 refuses) leaves the empty translation alone. What stays apart: CTranslate2
keeps its k best finished hypotheses by its own scores, before eos is added, so a hypothesis it
dropped there can be missing from the n-best list (on the tiny test model: never the best).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from nmt.inference.hypothesis import Hypothesis, TargetRequest
from nmt.errors import NmtError
from nmt.export.ctranslate2 import export_ctranslate2, import_ctranslate2, read_export_record, vocabulary_tokens
from nmt.run.identity import identity_difference, run_identity, tokenizer_sha256
from nmt.run.directory import RunDir
from nmt.data.tokenizer import Tokenizer
from nmt.inference.config import SearchConfig, TranslateConfig, resolve_inter_threads


def check_search_for_ctranslate2(search: SearchConfig) -> None:
    """CTranslate2 has one search rule and one length penalty; anything else is refused."""
    if search.lenpen_style != "avg":
        raise NmtError(f"--engine ctranslate2 has only the |Y|^alpha length penalty, not --lenpen-style {search.lenpen_style}; "
                       f"pass --lenpen-style avg (and --beam-style fairseq)")
    if search.beam_style != "fairseq":
        raise NmtError(f"--engine ctranslate2 searches with the fairseq rule only, not --beam-style {search.beam_style}; "
                       f"pass --beam-style fairseq")


@contextmanager
def _waiting_lock(path: Path) -> Iterator[None]:
    """Hold the POSIX lock of `path`, waiting while another process holds it.

    Not `nmt.run.lock.RunLock`: that one refuses a second writer, and two translates of one run
    must both succeed. The file stays: removing it would let a third process lock a file the
    waiting one no longer sees (see `nmt.run.lock`). The kernel drops the lock if we die.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _is_current_export(model_dir: Path, checkpoint: Path, identity: dict) -> bool:
    """Whether `model_dir` was exported from `checkpoint` as it is now, with this vocabulary
    (and by an nmt that records the checkpoint's identity, so it needs no torch to check)."""
    try:
        record = read_export_record(model_dir)
        newer = (model_dir / "model.bin").stat().st_mtime >= checkpoint.stat().st_mtime
    except (NmtError, OSError):
        return False
    return newer and "checkpoint_identity" in record and "alignment_layer" in record \
        and Path(record["checkpoint"]).resolve() == checkpoint.resolve() \
        and identity_difference(record["identity"], identity) is None


def cached_model_dir(run: RunDir, checkpoint: Path) -> tuple[Path, bool]:
    """RUN/ctranslate2/CHECKPOINT-STEM, exported now unless it holds this checkpoint's current
    export; returns (directory, whether it was exported now).

    Exported holding RUN/ctranslate2/.STEM.lock: two translates started at once would both
    export, and one would replace the directory the other is loading. The second waits, then
    finds the first one's export current. A current export needs no lock (nor a writable run).
    """
    model_dir = run.root / "ctranslate2" / checkpoint.stem
    identity = run_identity(run)
    if _is_current_export(model_dir, checkpoint, identity):
        return model_dir, False
    with _waiting_lock(model_dir.parent / f".{model_dir.name}.lock"):
        if _is_current_export(model_dir, checkpoint, identity):  # exported while we waited
            return model_dir, False
        # translate has checked (and warned about) the checkpoint's vocabulary already
        return export_ctranslate2(run.root, model_dir, checkpoint=checkpoint, force=True, warn=lambda message: None), True


def check_export_vocabulary(model_dir: Path, record: dict, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer) -> None:
    """Refuse a model exported with another vocabulary than these tokenizers: its token strings
    are not theirs, which ends in a KeyError, or in garbage when the sizes agree."""
    exported = record["identity"]
    src, tgt = exported["source_lang"], exported["target_lang"]
    run_side = {"source_lang": src, "target_lang": tgt,
                "vocab_sha256": {src: tokenizer_sha256(src_tokenizer), tgt: tokenizer_sha256(tgt_tokenizer)}}
    difference = identity_difference(exported, run_side)
    if difference is not None:
        raise NmtError(f"CTranslate2 model {model_dir} was exported from another vocabulary than this run directory has "
                       f"({difference}, export vs run); export this run's model with `nmt export`, "
                       f"or pass the --run-dir it was exported from")


def _best_distinct(hyps: list[Hypothesis], n: int) -> list[Hypothesis]:
    """The `n` best hypotheses, each token sequence once: a prefix that fills the whole limit
    comes back once per beam (CTranslate2 scores all but one -1e10), and eos scores them alike."""
    best: dict[tuple[int, ...], Hypothesis] = {}
    for h in sorted(hyps, key=lambda h: h.score, reverse=True):
        best.setdefault(tuple(h.tokens), h)
    return list(best.values())[:n]


class CTranslate2Decoder:
    """The decoding strategy whose search runs in CTranslate2, on an exported model."""

    constrains = False
    path = "ctranslate2"
    """Whether it searches with constraints."""

    def __init__(self, model_dir: Path, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, cfg: TranslateConfig):
        cfg.validate()
        ctranslate2 = import_ctranslate2()
        record = read_export_record(model_dir)
        check_export_vocabulary(Path(model_dir), record, src_tokenizer, tgt_tokenizer)
        self.cfg = cfg
        self.record = record
        """The export's nmt_export.json (`nmt.export.ctranslate2`): model configuration and size included."""
        self.model_dir = Path(model_dir)
        self.max_positions = int(record["max_positions"])
        self.decoder_layers = int(record["model"]["decoder_layers"]) if "model" in record else 0
        self.alignment_layer = record.get("alignment_layer")
        """The decoder layer whose attention `return_attention` gives (None: an export older than alignments)."""
        device = cfg.device.split(":")[0]
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        index = int(cfg.device.split(":")[1]) if ":" in cfg.device else 0
        # --threads and --inter-threads mean what they mean for nmt's engine: CTranslate2's
        # inter_threads x intra_threads (on a CPU, its batches run on `inter` workers at once).
        threads = cfg.threads or os.cpu_count() or 1
        inter = resolve_inter_threads(cfg.inter_threads, threads, device)
        intra = threads // inter if device == "cpu" else cfg.threads
        self.max_tokens = cfg.batch_tokens(ctranslate2_on_cpu=device == "cpu")
        """CTranslate2's `max_batch_size` in source tokens (`TranslateConfig.batch_tokens`)."""
        try:
            self.engine = ctranslate2.Translator(str(model_dir), device=device, device_index=index,
                                                 compute_type=cfg.ct2_compute_type, inter_threads=inter, intra_threads=intra)
        except (RuntimeError, ValueError) as e:
            raise NmtError(f"CTranslate2 cannot load {model_dir} ({str(e).splitlines()[0]})") from None
        self.src_pieces = vocabulary_tokens(src_tokenizer)
        tgt_pieces = self.tgt_pieces = vocabulary_tokens(tgt_tokenizer)
        self.tgt_ids = {piece: i for i, piece in enumerate(tgt_pieces)}
        ids = tgt_tokenizer.special_ids
        self.suppress = [[tgt_pieces[ids.pad]], [tgt_pieces[ids.bos]]]
        self.eos_piece = tgt_pieces[ids.eos]

    def decode(self, ids: list[list[int]], search: SearchConfig, requests: Optional[Sequence[TargetRequest]] = None,
               alignment_layer: Optional[int] = None) -> list[list[Hypothesis]]:
        """Each line's hypotheses from CTranslate2's beam search (nmt's `Decoder` contract):
        one call for all lines, again for the few that reached their own limit, then eos
        after the hypotheses that took every step (see above)."""
        check_search_for_ctranslate2(search)
        if requests is not None and any(r.constraints for r in requests):
            raise NmtError("--engine ctranslate2 has no constrained search; translate with --constraints on --engine nmt")
        attention = alignment_layer is not None
        if attention:
            self.check_alignment_layer(alignment_layer)
        hyps: list[list[Hypothesis]] = [[] for _ in ids]
        lines = [i for i, seq in enumerate(ids) if seq]
        if not lines:
            return hyps
        prefixes = {i: list(requests[i].prefix) if requests is not None else [] for i in lines}
        limits = {i: self.decoding_length(len(ids[i]), search) for i in lines}
        searched = [i for i in lines if limits[i] > 0]
        results: dict[int, Any] = {}  # line: its CTranslate2 TranslationResult
        if searched:
            longest = max(limits[i] for i in searched)
            again: dict[int, list[int]] = {}
            for i, result in zip(searched, self._search(ids, searched, longest, search, prefixes, attention)):
                steps = max(len(pieces) for pieces in result.hypotheses)
                if steps < limits[i] or limits[i] == longest:
                    results[i] = result
                else:
                    again.setdefault(limits[i], []).append(i)
            for limit, group in again.items():
                results.update(zip(group, self._search(ids, group, limit, search, prefixes, attention)))
        at_limit = [(i, Hypothesis([], 0.0, 0.0)) for i in lines if i not in results]  # limit 0: the empty translation
        for i, result in results.items():
            for h, ended in self._hypotheses(result, search, attention):
                if ended:
                    hyps[i].append(h)
                else:
                    at_limit.append((i, h))
        for (i, h), log_prob in zip(at_limit, self._log_probs_with_eos(ids, prefixes, at_limit)):
            length = len(h.tokens) + 1  # the forced eos
            hyps[i].append(Hypothesis(h.tokens, log_prob / length**search.lenpen, log_prob, h.attention))
        for i in lines:
            hyps[i] = _best_distinct(hyps[i], search.nbest)
        if attention:
            for i, row in zip(lines, self._first_attention_rows([ids[i] for i in lines])):
                if hyps[i] and hyps[i][0].attention:
                    hyps[i][0].attention[0] = row
        return hyps

    def _first_attention_rows(self, ids: list[list[int]]) -> list[list[float]]:
        """Each line's attention at the first decoding step, from a one-step greedy search (see above)."""
        results = self.engine.translate_batch(
            [[self.src_pieces[t] for t in seq] for seq in ids], max_batch_size=self.max_tokens, batch_type="tokens",
            beam_size=1, min_decoding_length=0, max_decoding_length=1, return_attention=True)
        return [list(r.attention[0][0]) for r in results]

    def check_alignment_layer(self, layer: int) -> None:
        """Refuse an alignment layer (from 0) other than the one the export's attention comes from."""
        if layer != self.alignment_layer:
            have = "no attention (exported before alignments)" if self.alignment_layer is None else \
                f"the attention of decoder layer {self.alignment_layer} (from 0)"
            raise NmtError(f"CTranslate2 model {self.model_dir} gives {have}, not of --alignment-layer {layer} (from 0); "
                           f"export it again with `nmt export --force` for the default layer, or align with --engine nmt")

    def decoding_length(self, source_length: int, search: SearchConfig) -> int:
        """CTranslate2's `max_decoding_length` for nmt's limit: the tokens before eos (see above)."""
        return search.max_output_length(source_length, self.max_positions)

    def _search(self, ids: list[list[int]], lines: list[int], max_length: int, search: SearchConfig,
                prefixes: dict[int, list[int]], attention: bool = False) -> list:
        """One `translate_batch` of `lines`: CTranslate2 sorts them and cuts token-based batches."""
        target_prefix = None
        if any(prefixes[i] for i in lines):
            target_prefix = [[self.tgt_pieces[t] for t in prefixes[i]] or None for i in lines]
        return self.engine.translate_batch(
            [[self.src_pieces[t] for t in ids[i]] for i in lines], target_prefix,
            max_batch_size=self.max_tokens, batch_type="tokens", beam_size=search.beam, patience=1,
            length_penalty=search.lenpen, num_hypotheses=search.beam, return_scores=True, return_end_token=True,
            min_decoding_length=0, max_decoding_length=max_length, suppress_sequences=self.suppress,
            return_attention=attention,
        )

    def _hypotheses(self, result, search: SearchConfig, attention: bool = False) -> list[tuple[Hypothesis, bool]]:
        """Every hypothesis of a result as nmt's, and whether it ended with eos (the others took
        every step the limit allowed)."""
        found = []
        for n, (pieces, score) in enumerate(zip(result.hypotheses, result.scores)):
            length = len(pieces)  # eos included, as nmt counts |Y|
            ended = bool(pieces) and pieces[-1] == self.eos_piece
            weights = [list(row) for row in result.attention[n]] if attention else None
            tokens = [self.tgt_ids[p] for p in (pieces[:-1] if ended else pieces)]
            found.append((Hypothesis(tokens, score, score * length**search.lenpen, weights), ended))
        return found

    def _log_probs_with_eos(self, ids: list[list[int]], prefixes: dict[int, list[int]],
                            hyps: list[tuple[int, Hypothesis]]) -> list[float]:
        """log P of each line's hypothesis followed by eos (after its line's prefix, as the search
        counts it): what nmt's search adds when it forces eos at the limit."""
        if not hyps:
            return []
        scored = self.engine.score_batch([[self.src_pieces[t] for t in ids[i]] for i, _ in hyps],
                                         [[self.tgt_pieces[t] for t in h.tokens] for _, h in hyps],
                                         max_batch_size=self.max_tokens, batch_type="tokens")
        return [sum(s.log_probs[len(prefixes[i]):]) for (i, _), s in zip(hyps, scored)]
