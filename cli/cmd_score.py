"""`nmt score`: sacreBLEU BLEU/chrF/TER with signatures, or the paper's compound-split BLEU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nmt_cli.common import RunDirOption


def register(app: typer.Typer) -> None:
    @app.command("score")
    def score(
        ref: Annotated[Optional[list[Path]], typer.Option("--ref", help="Reference file (plain or .gz); repeat for several references.", show_default=False)] = None,
        subset: Annotated[Optional[str], typer.Option("--subset", help="Score against the raw target side of a split preprocess recorded in --run-dir (test, valid, ...); --lang defaults to the run's target language.", show_default=False)] = None,
        run_dir: RunDirOption = None,
        hyp: Annotated[Optional[Path], typer.Option("--hyp", help="Hypotheses file (plain or .gz); default: stdin.", show_default=False)] = None,
        tokenize: Annotated[Optional[str], typer.Option("--tokenize", "-tok", help="sacreBLEU tokenizer for BLEU: 13a, intl, zh, char, none, ja-mecab, ko-mecab, ... (default: 13a, or from --lang); or moses: BLEU on Moses-tokenized text (tokenizer.perl defaults, --lang's rules), unsmoothed as multi-bleu.perl; with --lowercase the convention of the Multi30k papers (Wu et al. 2021, fairseq).", show_default=False)] = None,
        lowercase: Annotated[bool, typer.Option("--lowercase", "-lc", help="Case-insensitive BLEU and chrF.")] = False,
        ter: Annotated[bool, typer.Option("--ter", help="Also compute TER.")] = False,
        lang: Annotated[Optional[str], typer.Option("--lang", "-l", help="Target language: picks sacreBLEU's default tokenizer (zh, ja, ko) and the Moses rules of --tokenize moses and --compound-split (default: the target language of --run-dir when it is a preprocessed run, else de).", show_default=False)] = None,
        compound_split: Annotated[bool, typer.Option("--compound-split", help="The paper's tokenized WMT14 En-De BLEU (Moses tokenizer, ##AT## compound splitting, multi-bleu.perl); not comparable to sacreBLEU.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
        encoding_errors: Annotated[str, typer.Option("--encoding-errors", help="Invalid UTF-8 in hypotheses or references: strict (error naming the file and line) or replace (with U+FFFD).")] = "strict",
    ) -> None:
        """Score hypotheses against references: sacreBLEU BLEU with its signature and chrF."""
        from nmt import score as scoring
        from nmt.errors import NmtError
        from nmt.data.textio import read_lines, stdin_lines

        if encoding_errors not in ("strict", "replace"):
            raise NmtError(f"--encoding-errors must be strict or replace, not {encoding_errors!r}")
        if (ref is None) == (subset is None):
            raise NmtError("give the references with --ref FILE, or --subset SPLIT to use the run's recorded split (not both)")
        if subset is not None:
            from nmt.run.directory import resolve_run_dir
            from nmt.run.splits import split_text_file, target_lang

            run_path = resolve_run_dir(run_dir)
            ref = [split_text_file(run_path, subset, "target")]
            lang = lang or target_lang(run_path)
        lang = lang or _run_target_lang(run_dir) or "de"
        if compound_split and (tokenize is not None or lowercase):
            raise NmtError("--compound-split uses its own Moses tokenization and is case-sensitive; drop --tokenize/--lowercase")
        if hyp is not None:
            hyp_name = str(hyp)
            hypotheses = list(read_lines(hyp, encoding_errors))
        else:
            hyp_name = "<stdin>"
            hypotheses = list(stdin_lines(sys.stdin.buffer, encoding_errors))
        references = scoring.read_references(ref, len(hypotheses), hyp_name, encoding_errors)
        if hypotheses and not any(h.strip() for h in hypotheses):
            print(f"nmt score: warning: all {len(hypotheses)} hypotheses in {hyp_name} are empty, so every score is 0; "
                  f"was the translation cut short, or written elsewhere?", file=sys.stderr)

        if compound_split:
            result = scoring.compound_split_bleu(hypotheses, references, lang=lang)
            if as_json:
                print(json.dumps(result.to_dict(), sort_keys=True))
            else:
                print(f"# {scoring.COMPOUND_SPLIT_LABEL}")
                print(result.format())
            return

        scores = scoring.sacrebleu_scores(hypotheses, references, tokenize=tokenize, lowercase=lowercase, ter=ter, target_lang=lang)
        if as_json:
            print(json.dumps(scores, sort_keys=True))
        else:
            print(scoring.format_sacrebleu(scores))


def _run_target_lang(run_dir: Optional[Path]) -> Optional[str]:
    """The target language of the run directory (the flag, $NMT_RUN_DIR or the cwd), where it is
    a preprocessed run; None elsewhere (scoring plain files needs no run)."""
    from nmt.errors import NmtError
    from nmt.run.directory import RunDir, resolve_run_dir
    from nmt.run.splits import target_lang

    run = resolve_run_dir(run_dir)
    if not RunDir(run).has_record("preprocess"):
        return None
    try:
        return target_lang(run)
    except (NmtError, OSError, KeyError):
        return None
