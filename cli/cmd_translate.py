"""`nmt translate`: raw text in, one translation per line out, in order."""

from __future__ import annotations

import inspect
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from nmt_cli import fast_exit
from nmt_cli.common import CONTEXT, RunDirOption, engine_search
from nmt_cli.dataclass_options import dataclass_parameters, with_parameters

HELP = (
    "Translate raw text from stdin (or --input) with the paper's beam search (beam 4, length penalty 0.6).\n\n"
    "Uses checkpoint_avg.pt, else checkpoint_best.pt, else checkpoint_last.pt of the run (named on stderr); "
    "repeat --checkpoint to ensemble several (average of log-probabilities). Every input line gets exactly one "
    "output line, in order; an empty line gives an empty line; lines longer than the model's positions are "
    "truncated and counted in one warning at the end. Whenever the input pauses (a pipe, a FIFO, a program that "
    "writes a line and waits), the lines held so far are translated and their output flushed at once. "
    "--subset test translates the source side of the run's recorded test split.\n\n"
    "Word alignments, a forced prefix and terminology constraints (docs/translation.md):\n\n"
    "  nmt translate --print-alignment < in.en    # Ein Hund läuft. ||| 0-0 1-1 2-2 2-3\n\n"
    "  nmt translate --prefix-file starts.de < in.en    # each output begins with its line of starts.de\n\n"
    "  printf 'A dog runs.\\tHund\\n' | nmt translate --constraints    # the output contains \"Hund\""
)


CONTROL_PANEL = "Alignments, prefixes and constraints"


def register(app: typer.Typer) -> None:
    from nmt.inference.sampling_config import SamplingConfig
    from nmt.inference.config import AlignmentConfig, SearchConfig, TranslateConfig

    search_fields = [p.name for p in dataclass_parameters(SearchConfig)]
    sampling_fields = [p.name for p in dataclass_parameters(SamplingConfig)]
    alignment_fields = [p.name for p in dataclass_parameters(AlignmentConfig)]
    params = [
        CONTEXT,
        inspect.Parameter("run_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RunDirOption),
        inspect.Parameter("input", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[Path], typer.Option("--input", "-i", help="Text to translate, plain or .gz (default: stdin).", show_default=False)]),
        inspect.Parameter("subset", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[str], typer.Option("--subset", "--gen-subset", show_default=False,
                                        help="Translate the source side of a split preprocess recorded (test, valid, test1, ...) instead of stdin.")]),
        inspect.Parameter("checkpoint", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[list[str]], typer.Option("--checkpoint", "-c", "--path", show_default=False,
                                              help="Checkpoint file (or a name in RUN/checkpoints); repeat to ensemble "
                                                   "(or, as fairseq's --path, join them with ':').")]),
        inspect.Parameter("format", inspect.Parameter.KEYWORD_ONLY, default="text", annotation=Annotated[
            str, typer.Option("--format", help="text: one translation per line; jsonl: one object per line with "
                                               "\"hyp\", \"score\" and the \"nbest\" list.")]),
        inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
            bool, typer.Option("--quiet", "-q", help="No checkpoint name, progress bar or summary on stderr (warnings stay).")]),
        inspect.Parameter("prefix_file", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[Path], typer.Option(
                "--prefix-file", show_default=False, rich_help_panel=CONTROL_PANEL,
                help="Target prefixes, one per input line (an empty line: none): each translation starts with its "
                     "prefix, in its tokenization, and the search continues from there (CTranslate2's target_prefix, "
                     "OpenNMT-py's tgt_prefix). Scores then count the tokens after the prefix.")]),
        inspect.Parameter("constraints", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
            bool, typer.Option(
                "--constraints", rich_help_panel=CONTROL_PANEL,
                help="Input lines are 'source<TAB>phrase<TAB>phrase...' (fairseq's convention): each target phrase "
                     "appears in the translation, in any order, by lexically constrained beam search (dynamic beam "
                     "allocation, Post and Vilar 2018, as fairseq's --constraints). A line without a tab has none and "
                     "is searched as without this flag.")]),
    ]
    params += dataclass_parameters(SearchConfig, panel=lambda _: "Beam search (Section 6.1)")
    params += dataclass_parameters(SamplingConfig, panel=lambda _: "Sampling (back-translation)")
    params += dataclass_parameters(TranslateConfig, panel=lambda _: "Input, batching and device")
    params += dataclass_parameters(AlignmentConfig, panel=lambda _: CONTROL_PANEL)

    def translate_command(**kwargs: Any) -> None:
        import json

        from nmt.errors import NmtError
        from nmt.run.directory import resolve_run_dir
        from nmt.inference.input_buffer import input_buffers
        from nmt.data.textio import count_lines, text_stdout
        from nmt.inference.translator import DECODER_PATHS, freeze_loaded_objects, load_translator
        from nmt.inference.word_alignment import soft_text

        run_dir = resolve_run_dir(kwargs.pop("run_dir"))
        input_path, checkpoints = kwargs.pop("input"), _ensemble(kwargs.pop("checkpoint") or [])
        subset = kwargs.pop("subset")
        fmt, quiet = kwargs.pop("format"), kwargs.pop("quiet")
        engine_note = engine_search(kwargs, kwargs.pop("ctx"))
        search = SearchConfig(**{k: kwargs.pop(k) for k in search_fields})
        sampling = SamplingConfig(**{k: kwargs.pop(k) for k in sampling_fields})
        sampling.validate()
        alignment = AlignmentConfig(**{k: kwargs.pop(k) for k in alignment_fields})
        alignment.validate()
        prefix_file, with_constraints = kwargs.pop("prefix_file"), kwargs.pop("constraints")
        cfg = TranslateConfig(**kwargs)
        search.validate()
        cfg.validate()
        if fmt not in ("text", "jsonl"):
            raise NmtError(f"--format must be text or jsonl, not {fmt!r}")
        if sampling.sampling and search.nbest > 1:
            raise NmtError("--sampling draws one translation per line; drop --nbest")
        if fmt == "text" and search.nbest > 1:
            raise NmtError("--nbest above 1 needs --format jsonl (text output has exactly one line per input line)")

        def say(message: str) -> None:
            if not quiet:
                print(f"nmt translate: {message}", file=sys.stderr, flush=True)

        if subset is not None:
            from nmt.run.splits import split_text_file

            if input_path is not None:
                raise NmtError("give --input or --subset, not both")
            input_path = split_text_file(run_dir, subset, "source")
        # Buffers end when the input pauses, so a program that writes a line and waits gets its answer.
        chunks = input_buffers(input_path, lambda: sys.stdin.buffer, cfg.buffer_size, cfg.encoding_errors)
        first = next(chunks, [])  # bad input fails before the model loads
        prefixes = _read_prefixes(prefix_file, input_path, cfg.encoding_errors) if prefix_file is not None else None
        if prefixes is not None and len(first) > len(prefixes):
            raise NmtError(f"--prefix-file {prefix_file} has {len(prefixes)} lines, but the input has more; "
                           f"give one prefix line per input line (an empty line for none)")

        loading = time.perf_counter()
        translator = load_translator(run_dir, checkpoints, search, cfg, sampling, alignment)
        say(("checkpoint " if len(translator.checkpoints) == 1 else "ensemble of ")
            + ", ".join(map(str, translator.checkpoints))
            + f"; decoder {translator.decoder_path}: {DECODER_PATHS[translator.decoder_path]}"
            + f"; loaded in {time.perf_counter() - loading:.1f} s")
        if cfg.engine == "ctranslate2":
            say(f"CTranslate2 model {translator.decoder.model_dir}" + (f"; {engine_note}" if engine_note else ""))
        elif translator.decoder.device.type == "cpu":
            from nmt.ops.cpu_malloc import keep_freed_memory

            keep_freed_memory()  # each decoder step frees what the next allocates again (see there)
        freeze_loaded_objects()
        # The summary's seconds and sentences/s count translating only, from here (as
        # fairseq-generate's do): loading (torch's import, the checkpoint) is said above.
        start = time.perf_counter()

        out = text_stdout()
        bar = None
        if not quiet and sys.stderr.isatty() and not sys.stdout.isatty():  # a bar only where a person watches
            from tqdm import tqdm

            total = count_lines(input_path) if input_path is not None and input_path.is_file() else None
            bar = tqdm(total=total, unit=" lines", file=sys.stderr, delay=2.0, leave=False, dynamic_ncols=True)
        n_lines = 0
        empty = [0, 0]  # (non-empty input lines, those of them translated to nothing)
        try:
            for chunk in itertools.chain([first] if first else [], chunks):
                phrases = None
                if with_constraints:
                    fields = [line.split("\t") for line in chunk]
                    chunk, phrases = [f[0] for f in fields], [f[1:] for f in fields]
                line_prefixes = None
                if prefixes is not None:
                    line_prefixes = prefixes[n_lines : n_lines + len(chunk)]
                    if len(line_prefixes) < len(chunk):
                        raise NmtError(f"--prefix-file {prefix_file} has {len(prefixes)} lines, but the input has more; "
                                       f"give one prefix line per input line (an empty line for none)")
                for source, tr in zip(chunk, translator.translate(chunk, line_prefixes, phrases, first_line=n_lines + 1), strict=True):
                    if source.strip():
                        empty[0] += 1
                        empty[1] += not tr.hyp.strip()
                    if fmt == "jsonl":
                        row = {"hyp": tr.hyp, "score": tr.score, "nbest": [{"hyp": h, "score": s} for h, s in tr.nbest]}
                        if tr.alignment is not None:
                            row["alignment"] = tr.alignment
                        out.write(json.dumps(row, ensure_ascii=False))
                    else:
                        out.write(tr.hyp)
                        if tr.alignment is not None:
                            out.write(" ||| " + (tr.alignment if isinstance(tr.alignment, str) else soft_text(tr.alignment)))
                    out.write("\n")
                out.flush()
                n_lines += len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
        except BrokenPipeError:  # the reader (`| head`) stopped reading: not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return
        if bar is not None:
            bar.close()
        if translator.truncated:
            print(f"nmt translate: warning: {translator.truncated} line(s) longer than the model's "
                  f"{translator.max_positions} positions were truncated", file=sys.stderr)
        if prefixes is not None and len(prefixes) > n_lines:
            raise NmtError(f"--prefix-file {prefix_file} has {len(prefixes)} lines, the input {n_lines}; "
                           f"give one prefix line per input line (an empty line for none)")
        if translator.unmet_constraints:
            print(f"nmt translate: warning: {translator.unmet_constraints} line(s) reached the output length limit before "
                  f"their translation held every constraint phrase; raise --max-len-b or shorten the phrases",
                  file=sys.stderr)
        if translator.no_hypothesis:
            print(f"nmt translate: warning: {translator.no_hypothesis} line(s) got an empty translation because the "
                  f"search found no hypothesis of finite score (is the checkpoint damaged, or --amp overflowing?)",
                  file=sys.stderr)
        if empty[0] and empty[0] == empty[1]:
            print(f"nmt translate: warning: all {empty[0]} non-empty input line(s) got an empty translation; is the "
                  f"model trained enough (logs/train.jsonl), and is the input in its source language?", file=sys.stderr)
        seconds = time.perf_counter() - start
        say(f"{n_lines} lines, {translator.target_tokens} target tokens in {seconds:.1f} s "
            f"({n_lines / max(seconds, 1e-9):.1f} sentences/s)")
        fast_exit.request()  # the output is flushed and nothing else runs: skip torch's slow teardown

    app.command("translate", help=HELP)(with_parameters(translate_command, params))


def _read_prefixes(prefix_file: Path, input_path: Optional[Path], errors: str) -> list[str]:
    """The lines of --prefix-file; when the input is a file, checked against its line count first."""
    from nmt.data.textio import count_lines, read_lines
    from nmt.errors import NmtError

    if not prefix_file.is_file():
        raise NmtError(f"--prefix-file {prefix_file} is not a file; give one prefix line per input line")
    prefixes = list(read_lines(prefix_file, errors))
    if input_path is not None and input_path.is_file():
        n = count_lines(input_path)
        if n != len(prefixes):
            raise NmtError(f"--prefix-file {prefix_file} has {len(prefixes)} lines, the input {input_path} {n}; "
                           f"give one prefix line per input line (an empty line for none)")
    return prefixes


def _ensemble(checkpoints: list[str]) -> list[str]:
    """fairseq's `--path a.pt:b.pt` is an ensemble: a name with ':' that is no file is split."""
    return [part for c in checkpoints for part in ([c] if ":" not in c or Path(c).exists() else c.split(":"))]
