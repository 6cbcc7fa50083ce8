"""`nmt preprocess`: learn the vocabulary and binarize parallel text into the run directory."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from nmt.preprocess_config import PreprocessConfig
from nmt_cli.common import RunDirOption

_D = PreprocessConfig()
_h = PreprocessConfig.help


def register(app: typer.Typer) -> None:
    @app.command("preprocess")
    def preprocess(
        source_lang: Annotated[Optional[str], typer.Option("--source-lang", "-s", help=_h("source_lang"), show_default=False)] = None,
        target_lang: Annotated[Optional[str], typer.Option("--target-lang", "-t", help=_h("target_lang"), show_default=False)] = None,
        trainpref: Annotated[Optional[str], typer.Option(help=_h("trainpref"), show_default=False)] = _D.trainpref,
        validpref: Annotated[Optional[str], typer.Option(help=_h("validpref"), show_default=False)] = _D.validpref,
        testpref: Annotated[Optional[str], typer.Option(help=_h("testpref"), show_default=False)] = _D.testpref,
        vocab_type: Annotated[str, typer.Option(help=_h("vocab_type"))] = _D.vocab_type,
        vocab_size: Annotated[int, typer.Option(help=_h("vocab_size"))] = _D.vocab_size,
        joined: Annotated[bool, typer.Option("--joined/--no-joined", help=_h("joined"))] = _D.joined,
        vocab: Annotated[Optional[str], typer.Option(help=_h("vocab"), show_default=False)] = _D.vocab,
        vocab_sample_lines: Annotated[int, typer.Option(help=_h("vocab_sample_lines"))] = _D.vocab_sample_lines,
        character_coverage: Annotated[float, typer.Option(help=_h("character_coverage"))] = _D.character_coverage,
        moses: Annotated[bool, typer.Option("--moses/--no-moses", help=_h("moses"))] = _D.moses,
        min_len: Annotated[int, typer.Option(help=_h("min_len"))] = _D.min_len,
        max_len: Annotated[int, typer.Option(help=_h("max_len"))] = _D.max_len,
        max_ratio: Annotated[float, typer.Option(help=_h("max_ratio"))] = _D.max_ratio,
        encoding_errors: Annotated[str, typer.Option(help=_h("encoding_errors"))] = _D.encoding_errors,
        seed: Annotated[int, typer.Option(help=_h("seed"))] = _D.seed,
        workers: Annotated[int, typer.Option("--workers", "-j", help=_h("workers"))] = _D.workers,
        force: Annotated[bool, typer.Option("--force", help="Replace an existing preprocessing result made with other settings.")] = False,
        run_dir: RunDirOption = None,
    ) -> None:
        """Learn a subword vocabulary and binarize parallel text (PREFIX.SRC / PREFIX.TGT) into the run directory.

        Writes vocab/, data/{split}.{lang}.bin/.idx and config/preprocess.json; ends with a summary on stderr.
        """
        from nmt.preprocess import run_preprocess
        from nmt.rundir import resolve_run_dir

        cfg = PreprocessConfig(
            source_lang=source_lang or "", target_lang=target_lang or "", trainpref=trainpref, validpref=validpref,
            testpref=testpref, vocab_type=vocab_type, vocab_size=vocab_size, joined=joined, vocab=vocab,
            vocab_sample_lines=vocab_sample_lines, character_coverage=character_coverage, moses=moses,
            min_len=min_len, max_len=max_len, max_ratio=max_ratio, encoding_errors=encoding_errors, seed=seed,
            workers=workers,
        )
        root = resolve_run_dir(run_dir)
        result = run_preprocess(root, cfg, force=force)
        console = _stderr_console()
        for note in result.notes:
            console.print(f"nmt preprocess: {note}", highlight=False, soft_wrap=True)  # one line, however long
        if not result.skipped:
            print_summary(console, result.record, root)


def _stderr_console() -> Any:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, width=120)
    return console


def print_summary(console: Any, record: dict[str, Any], root: Any) -> None:
    """The summary table: per split and side, sentences, tokens, unknown-token rate, drops."""
    from rich.table import Table

    from nmt.cleaning import reasons_text

    summary = record["summary"]
    table = Table(title=f"nmt preprocess: {root}", title_justify="left")
    for col, justify in (("split", "left"), ("side", "left"), ("sentences", "right"), ("tokens", "right"),
                         ("tok/sent", "right"), ("unk rate", "right"), ("empty", "right"), ("dropped pairs", "left")):
        table.add_column(col, justify=justify)
    for split, s in summary["splits"].items():
        n_dropped = sum(s["dropped"].values())
        if split == "train":
            dropped = f"{n_dropped} ({reasons_text(s['dropped'])})" if n_dropped else "0"
        else:
            n_unfiltered = sum(s["kept_unfiltered"].values())
            dropped = "never filtered" + (f"; {n_unfiltered} kept that break a rule ({reasons_text(s['kept_unfiltered'])})"
                                          if n_unfiltered else "")
        for i, (lang, side) in enumerate(s["sides"].items()):
            per_sent = side["tokens"] / side["sentences"] if side["sentences"] else 0.0
            table.add_row(split if i == 0 else "", lang, f"{side['sentences']:,}", f"{side['tokens']:,}", f"{per_sent:.1f}",
                          f"{100 * side['unk_rate']:.3f}%", f"{side['empty']:,}", dropped if i == 0 else "")
    console.print(table)
    vocab = ", ".join(f"{lang}: {path} ({record['vocab_sizes'][lang]})" for lang, path in record["vocab"].items())
    learned = summary["vocab"]
    origin = (f"copied from {learned['copied_from']}" if "copied_from" in learned
              else f"learned from {learned['pairs_used']:,} of {learned['sampled_pairs']:,} sampled training pairs")
    console.print(f"vocabulary: {record['vocab_type']}{' joined' if record['joined'] else ''}, {vocab}; {origin}; "
                  f"ids stored as {record['dtype']}{'; Moses-tokenized' if record['moses'] else ''}")
    console.print("valid/test are never filtered (empty lines stay as empty sentences); decoding the stored ids gives "
                  "back the input up to normalization (see `normalization` in config/preprocess.json).")
