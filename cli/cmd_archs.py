"""`nmt archs`: the named architectures and their sizes."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("archs")
    def archs(
        vocab_size: Annotated[int, typer.Option("--vocab-size", help="Joint vocabulary size for the parameter count (paper En-De: ~37000).")] = 37000,
    ) -> None:
        """List the architectures (--arch) with their parameter counts for a shared vocabulary."""
        from nmt.data.tokenizer import SPECIAL_TOKENS

        from nmt.settings import Range, check_value

        check_value("vocab_size", vocab_size, Range(len(SPECIAL_TOKENS) + 1, 10_000_000))
        from rich.console import Console
        from rich.table import Table

        from nmt.model.transformer import Transformer, count_parameters
        from nmt.model.config import ARCHS, build_config
        import torch

        table = Table(title=f"Architectures (joint vocabulary {vocab_size}, shared embeddings)")
        for col in ("arch", "layers", "d_model", "d_ff", "heads", "dropout", "parameters"):
            table.add_column(col, justify="right" if col != "arch" else "left")
        with torch.device("meta"):
            for name in ARCHS:
                cfg = build_config(name, vocab_size, vocab_size)
                n = count_parameters(Transformer(cfg))
                table.add_row(name, f"{cfg.encoder_layers}+{cfg.decoder_layers}", str(cfg.d_model), str(cfg.d_ff),
                              str(cfg.n_heads), str(cfg.dropout), f"{n / 1e6:.1f}M")
        Console().print(table)
