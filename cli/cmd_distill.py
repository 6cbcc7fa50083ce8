"""`nmt distill`: a teacher's translations of a corpus, as a student's training pair."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from nmt_cli.common import CONTEXT, RunDirOption, engine_search
from nmt_cli.dataclass_options import dataclass_parameters, with_parameters

HELP = (
    "Translate a corpus with a teacher (this run; repeat --checkpoint to ensemble) into a student's training "
    "pair: sequence-level knowledge distillation (Kim and Rush 2016), or, with a reverse model, --sampling and "
    "monolingual text, back-translation (Edunov et al. 2018).\n\n"
    "Writes OUT/train.SRC (the source as read) and OUT/train.TGT (one target per source line, in order; empty "
    "where the line gives nothing to learn: an empty or over-long source, no hypothesis), and OUT/summary.json "
    "with the counts; then `nmt preprocess --trainpref OUT/train` makes the student's run. With --reference, "
    "each line keeps the n-best hypothesis of highest sentence chrF against it (Mozilla's Firefox Translations "
    "pipeline; --nbest defaults to --beam then). Chunks of --chunk-lines lines are saved as they finish: a "
    "re-run of the same command continues where a killed one stopped, with byte-identical output; --workers "
    "and torchrun's ranks share the chunks.\n\n"
    "  nmt distill -r teacher --source train.en --reference train.de --beam 8 -o distilled\n\n"
    "  nmt distill -r de-en --source mono.de --sampling -o back    # back-translation"
)


def register(app: typer.Typer) -> None:
    from nmt.distill.job import DistillConfig
    from nmt.inference.config import SearchConfig, TranslateConfig
    from nmt.inference.sampling_config import SamplingConfig

    groups = {"search": SearchConfig, "sampling": SamplingConfig, "translate": TranslateConfig, "distill": DistillConfig}
    names = {group: [p.name for p in dataclass_parameters(cls)] for group, cls in groups.items()}
    params = [
        CONTEXT,
        inspect.Parameter("run_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RunDirOption),
        inspect.Parameter("source", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[
            Path, typer.Option("--source", show_default=False, help="The corpus's source side (plain or .gz), in the teacher's source language.")]),
        inspect.Parameter("reference", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[Path], typer.Option("--reference", show_default=False,
                                         help="Its human target side, line-aligned, for --select chrf (none: monolingual source).")]),
        inspect.Parameter("output", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[
            Path, typer.Option("--output", "-o", show_default=False, help="Folder for the distilled pair, its chunks and summary.")]),
        inspect.Parameter("checkpoint", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[list[str]], typer.Option("--checkpoint", "-c", "--path", show_default=False,
                                              help="Teacher checkpoint (or a name in RUN/checkpoints); repeat to ensemble.")]),
        inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
            bool, typer.Option("--quiet", "-q", help="No progress bar or summary on stderr.")]),
    ]
    params += dataclass_parameters(DistillConfig, panel=lambda _: "Distillation")
    params += dataclass_parameters(SearchConfig, panel=lambda _: "Beam search (Section 6.1)")
    params += dataclass_parameters(SamplingConfig, panel=lambda _: "Sampling (back-translation)")
    params += dataclass_parameters(TranslateConfig, panel=lambda _: "Input, batching and device")

    def distill_command(**kwargs: Any) -> None:
        from nmt.distill.job import distill
        from nmt.run.directory import resolve_run_dir
        from nmt_cli.cmd_translate import _ensemble

        ctx = kwargs.pop("ctx")
        run_dir = resolve_run_dir(kwargs.pop("run_dir"))
        source, reference, output = kwargs.pop("source"), kwargs.pop("reference"), kwargs.pop("output")
        checkpoints, quiet = _ensemble(kwargs.pop("checkpoint") or []), kwargs.pop("quiet")
        note = engine_search(kwargs, ctx)
        settings = {group: cls(**{k: kwargs.pop(k) for k in names[group]}) for group, cls in groups.items()}
        search, distill_cfg = settings["search"], settings["distill"]
        nbest_typed = getattr(ctx.get_parameter_source("nbest"), "name", "DEFAULT") != "DEFAULT"
        if reference is not None and distill_cfg.select == "chrf" and not nbest_typed and not settings["sampling"].sampling:
            search.nbest = search.beam  # chrF picks among the whole beam
        for cfg in settings.values():
            cfg.validate()

        def say(message: str) -> None:
            if not quiet:
                print(f"nmt distill: {message}", file=sys.stderr, flush=True)

        if note:
            say(note)
        summary = distill(run_dir, source, output, reference=reference, checkpoints=checkpoints, search=search,
                          translate=settings["translate"], sampling=settings["sampling"], config=distill_cfg,
                          progress=not quiet, say=say)
        if summary:
            dropped = ", ".join(f"{summary[k]} {k.replace('_', ' ')}" for k in ("empty", "too_long", "no_hypothesis"))
            say(f"{summary['lines']} lines -> {summary['source']}, {summary['target']}: {summary['kept']} kept "
                f"(select {summary['select']}); dropped: {dropped}")

    app.command("distill", help=HELP)(with_parameters(distill_command, params))
