"""`nmt export`: hand a run's model to another inference engine (CTranslate2)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nmt_cli.common import RunDirOption

HELP = (
    "Write the run's model as a CTranslate2 model directory (model.bin, config.json, the vocabulary, the run's "
    "tokenizer and nmt_export.json), built through CTranslate2's own specs API (pip install 'nmt\\[ct2]'). "
    "Decode it with `nmt translate -r RUN --engine ctranslate2 --ct2-model DIR` (fairseq's search and the |Y|^alpha "
    "penalty, CTranslate2's own), or without nmt, with pieces from DIR's tokenizer: "
    "`ctranslate2.Translator(DIR).translate_batch(\\[pieces], beam_size=4, length_penalty=0.6, return_end_token=True, "
    "max_decoding_length=len(pieces) + 50)` (nmt's defaults: beam 4, alpha 0.6, at most |X| + 50 tokens before eos)."
)


def register(app: typer.Typer) -> None:
    @app.command("export", help=HELP)
    def export(
        run_dir: RunDirOption = None,
        format: Annotated[str, typer.Option("--format", help="Output format; ctranslate2 is the one there is.")] = "ctranslate2",
        output: Annotated[Path, typer.Option("--output", "-o", help="Model directory to write (must not exist unless --force).", show_default=False)] = ...,
        checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", "-c", show_default=False,
                                                          help="Checkpoint file (or a name in RUN/checkpoints); default: avg, else best, else last.")] = None,
        quantization: Annotated[Optional[str], typer.Option("--quantization", show_default=False,
                                                            help="Store weights as int8, int8_float32, float16 or bfloat16 (default: float32).")] = None,
        force: Annotated[bool, typer.Option("--force", help="Replace an earlier export at --output; never anything else (a run directory, a folder nmt did not write).")] = False,
    ) -> None:
        from nmt.errors import NmtError
        from nmt.export.ctranslate2 import export_ctranslate2
        from nmt.run.directory import resolve_run_dir

        if format != "ctranslate2":
            raise NmtError(f"unknown --format {format!r}; the export format is ctranslate2")
        out = export_ctranslate2(resolve_run_dir(run_dir), output, checkpoint, quantization, force)
        print(f"nmt export: wrote {out}", file=sys.stderr)
