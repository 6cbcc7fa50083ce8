"""`nmt preprocess`: learn the vocabulary and binarize parallel text into the run directory."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from nmt.preprocess.config import PreprocessConfig
from nmt_cli.common import RunDirOption
from nmt_cli.dataclass_options import dataclass_parameters, with_parameters

SHORT = {"source_lang": "-s", "target_lang": "-t", "workers": "-j"}
"""fairseq-preprocess's short options."""

HELP = (
    "Learn a subword vocabulary and binarize parallel text (PREFIX.SRC / PREFIX.TGT) into the run directory.\n\n"
    "Writes vocab/, data/{split}.{lang}.bin/.idx and config/preprocess.json; ends with a summary on stderr."
)


def register(app: typer.Typer) -> None:
    params = dataclass_parameters(PreprocessConfig, short=SHORT)
    params += [
        inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
            bool, typer.Option("--force", help="Replace an existing preprocessing result made with other settings.")]),
        inspect.Parameter("run_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RunDirOption),
    ]

    def preprocess_command(**kwargs: Any) -> None:
        from nmt.preprocess.pipeline import run_preprocess
        from nmt.run.directory import resolve_run_dir

        force, root = kwargs.pop("force"), resolve_run_dir(kwargs.pop("run_dir"))
        result = run_preprocess(root, PreprocessConfig(**kwargs), force=force)
        console = _stderr_console()
        for note in result.notes:
            console.print(f"nmt preprocess: {note}", highlight=False, soft_wrap=True)  # one line, however long
        if not result.skipped:
            print_summary(console, result.record, root)

    app.command("preprocess", help=HELP)(with_parameters(preprocess_command, params))


def _stderr_console() -> Any:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, width=120)
    return console


def print_summary(console: Any, record: dict[str, Any], root: Any) -> None:
    """The summary table: per split and side, sentences, tokens, unknown-token rate, drops."""
    from rich.table import Table

    from nmt.preprocess.cleaning import reasons_text

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
    sampling = record.get("subword_sampling")
    if sampling:
        tokens = summary["splits"]["train"]["samples"]
        mean = {lang: sum(t[lang] for t in tokens.values()) / len(tokens) for lang in record["vocab"]}
        det = {lang: side["tokens"] for lang, side in summary["splits"]["train"]["sides"].items()}
        growth = ", ".join(f"{lang} {mean[lang] / max(det[lang], 1):.2f}x" for lang in mean)
        console.print(f"subword sampling: {sampling['samples']} sampled segmentations of the training pairs "
                      f"({', '.join(sampling['splits'][:2])}{', ...' if sampling['samples'] > 2 else ''}), "
                      f"{sampling['method']}, alpha {sampling['alpha']:g}, {sampling.get('sides', 'both')} side(s); "
                      f"{growth} the deterministic tokens; "
                      f"`nmt train` takes one per epoch")
    console.print("valid/test are never filtered (empty lines stay as empty sentences); decoding the stored ids gives "
                  "back the input up to normalization (see `normalization` in config/preprocess.json).")
