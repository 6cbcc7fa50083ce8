"""`nmt import`: start from a pretrained model (an OPUS-MT / Marian Hugging Face folder)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nmt_cli.common import RunDirOption

FORMATS = ("hf-marian",)

HELP = (
    "Make a new run directory from a pretrained model already on disk: `nmt import -r RUN --from hf-marian DIR` reads a Hugging Face "
    "MarianMTModel folder (OPUS-MT, Helsinki-NLP/opus-mt-*: config.json, model.safetensors or pytorch_model.bin, "
    "source.spm, target.spm, vocab.json, tokenizer_config.json) and writes vocab/, config/preprocess.json and "
    "checkpoints/checkpoint_last.pt. Nothing is downloaded; transformers is not needed. Then `nmt translate`, "
    "`nmt serve`, `nmt export` and `nmt.load` work on the run, and `nmt preprocess --vocab RUN` + "
    "`nmt train --finetune-from RUN/checkpoints/checkpoint_last.pt` fine-tune it (docs/pretrained.md)."
)


def register(app: typer.Typer) -> None:
    @app.command("import", help=HELP)
    def import_(
        run_dir: RunDirOption = None,
        source: Annotated[Path, typer.Argument(help="The model folder to import.", show_default=False)] = ...,
        kind: Annotated[str, typer.Option("--from", help="What the folder is: hf-marian (a Hugging Face MarianMTModel folder).", show_default=False)] = ...,
        source_lang: Annotated[Optional[str], typer.Option("--source-lang", "-s", show_default=False,
                                                           help="Source language (default: tokenizer_config.json's source_lang).")] = None,
        target_lang: Annotated[Optional[str], typer.Option("--target-lang", "-t", show_default=False,
                                                           help="Target language (default: tokenizer_config.json's target_lang).")] = None,
        max_positions: Annotated[Optional[int], typer.Option("--max-positions", show_default=False,
                                                             help="Longest sequence in tokens, eos included (default and most: the model's max_position_embeddings).")] = None,
    ) -> None:
        from nmt.errors import NmtError
        from nmt.pretrained.hf_marian import import_hf_marian
        from nmt.run.directory import resolve_run_dir

        if kind not in FORMATS:
            raise NmtError(f"unknown --from {kind!r}; choose one of {', '.join(FORMATS)}")
        if max_positions is not None and max_positions < 1:
            raise NmtError(f"--max-positions {max_positions} must be at least 1")
        result = import_hf_marian(source, resolve_run_dir(run_dir), source_lang, target_lang, max_positions,
                                  progress=lambda message: print(f"nmt import: {message}", file=sys.stderr))
        from nmt.model.config import model_size

        c = result.config
        print(f"nmt import: wrote {result.run_dir}: {result.source_lang}-{result.target_lang}, {result.parameters:,} parameters, "
              f"{model_size(c)}, {c.activation}, vocabulary {c.src_vocab_size}", file=sys.stderr)
