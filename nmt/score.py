"""Scoring translations: sacreBLEU (BLEU, chrF, TER) and the paper's compound-split BLEU.

Two metrics on purpose, because they are not comparable (tensor2tensor#317, fairseq#1976):

* sacreBLEU (Post 2018) detokenized BLEU with its signature: the number to report.
* The paper's tokenized BLEU for WMT14 En-De (Vaswani et al. 2017, Table 2: 27.3 / 28.4),
  as tensor2tensor's `get_ende_bleu.sh` and fairseq's `compound_split_bleu.sh` computed it:
  Moses `tokenizer.perl -l de` (default escaping, no `-a`), one pass of
  `s/(\\S)-(\\S)/\\1 ##AT##-##AT## \\2/g` to split hyphenated compounds, then
  `multi-bleu.perl` (case-sensitive, no smoothing). It exists only to compare with papers
  that used it; on newstest2014.de the reference side counts 64,496 tokens.

Both metrics come from sacreBLEU's Python API; nothing here re-counts n-grams.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from nmt.errors import NmtError
from nmt.data.textio import read_lines

#: The compound split of get_ende_bleu.sh: "rich-text" -> "rich ##AT##-##AT## text".
#: One non-overlapping pass, as `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`: in
#: "a-b-c" only the first hyphen is split, because "b" was consumed by the first match.
COMPOUND_RE = re.compile(r"(\S)-(\S)")
COMPOUND_SUB = r"\1 ##AT##-##AT## \2"

MOSES = "moses"
"""`--tokenize moses`: hypotheses and references Moses-tokenized (`moses_tokenize`), then BLEU on
those tokens, as multi-bleu.perl on tokenized text; with --lowercase, the Multi30k papers' BLEU."""
MOSES_LABEL = (
    "lowercased, Moses-tokenized BLEU (sacremoses, tokenizer.perl defaults; multi-bleu.perl's counts): the convention "
    "of Wu et al. (2021) and fairseq's Multi30k numbers; NOT comparable to sacreBLEU's default 13a"
)

COMPOUND_SPLIT_LABEL = (
    "tokenized compound-split BLEU (Moses tokenizer, ##AT## compound splitting, "
    "multi-bleu.perl; the paper's WMT14 En-De metric, NOT comparable to sacreBLEU)"
)


# ---------------------------------------------------------------------------------------
# Input: hypotheses and references of equal length
# ---------------------------------------------------------------------------------------


def read_references(ref_paths: Sequence[str | Path], n_hypotheses: int, hyp_name: str,
                    errors: str = "strict") -> list[list[str]]:
    """Read each reference file (plain or .gz) and check it has one line per hypothesis.

    Returns one list of lines per reference file (sacreBLEU's "streams" layout).
    """
    if not ref_paths:
        raise NmtError("no reference given; pass --ref FILE (repeat it for several references)")
    if n_hypotheses == 0:
        raise NmtError(f"{hyp_name} holds no hypotheses; nothing to score (give the translations of the references)")
    refs = []
    for path in ref_paths:
        lines = list(read_lines(path, errors))
        if len(lines) != n_hypotheses:
            raise NmtError(
                f"line counts differ: {n_hypotheses} hypotheses in {hyp_name} but {len(lines)} "
                f"references in {path}; they must be parallel, one line per sentence"
            )
        refs.append(lines)
    return refs


# ---------------------------------------------------------------------------------------
# sacreBLEU
# ---------------------------------------------------------------------------------------


def sacrebleu_scores(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    tokenize: str | None = None,
    lowercase: bool = False,
    ter: bool = False,
    target_lang: str | None = None,
) -> dict[str, Any]:
    """Corpus BLEU, chrF (and TER) with sacreBLEU's defaults, plus their signatures.

    `tokenize=None` lets sacreBLEU choose from `target_lang` (13a, or zh/ja-mecab/ko-mecab),
    as its command line does with `-l`. `lowercase` applies to BLEU and chrF (sacreBLEU's
    `-lc` and `--chrf-lowercase`); TER is case-insensitive by default anyway. `tokenize="moses"`
    scores BLEU on Moses-tokenized text, unsmoothed, as multi-bleu.perl (MOSES_LABEL); chrF
    stays on the text as given.
    Returns a JSON-able dict: bleu, signature, bp, ratio, precisions, hyp_len, ref_len,
    chrf, chrf_signature (and ter, ter_signature).
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    if tokenize is not None and tokenize not in BLEU.TOKENIZERS and tokenize != MOSES:
        raise NmtError(f"unknown --tokenize {tokenize!r}; choose one of: {', '.join([*BLEU.TOKENIZERS, MOSES])}")
    hyps = list(hypotheses)
    refs = [list(r) for r in references]
    bleu_hyps, bleu_refs = hyps, refs
    if tokenize == MOSES:  # lowercase, then tokenize (as the papers' scripts); sacreBLEU must not tokenize again
        lang = target_lang or "en"
        case = str.lower if lowercase else str
        bleu_hyps = moses_tokenize(map(case, hyps), lang)
        bleu_refs = [moses_tokenize(map(case, r), lang) for r in refs]
    try:
        bleu_metric = (BLEU(tokenize="none", lowercase=lowercase, smooth_method="none", force=True)
                       if tokenize == MOSES else BLEU(tokenize=tokenize, lowercase=lowercase, trg_lang=target_lang or ""))
    except Exception as e:  # mecab/spm tokenizers need extra packages or a download
        raise NmtError(f"sacreBLEU cannot use --tokenize {tokenize}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    bleu = bleu_metric.corpus_score(bleu_hyps, bleu_refs)
    signature = str(bleu_metric.get_signature())
    if tokenize == MOSES:  # say what tokenized it: sacreBLEU itself only saw "none"
        signature = signature.replace("tok:none", f"tok:moses-{lang}")
    chrf_metric = CHRF(lowercase=lowercase)
    chrf = chrf_metric.corpus_score(hyps, refs)
    result: dict[str, Any] = {
        "bleu": bleu.score,
        "signature": signature,
        "bleu_verbose": bleu.format(width=2, signature=signature),
        "bp": bleu.bp,
        "ratio": bleu.sys_len / bleu.ref_len if bleu.ref_len else 0.0,
        "precisions": list(bleu.precisions),
        "hyp_len": bleu.sys_len,
        "ref_len": bleu.ref_len,
        "chrf": chrf.score,
        "chrf_signature": str(chrf_metric.get_signature()),
        "chrf_verbose": chrf.format(width=2, signature=str(chrf_metric.get_signature())),
        "nrefs": len(refs),
        "lines": len(hyps),
    }
    if ter:
        ter_metric = TER()
        ter_score = ter_metric.corpus_score(hyps, refs)
        result["ter"] = ter_score.score
        result["ter_signature"] = str(ter_metric.get_signature())
        result["ter_verbose"] = ter_score.format(width=2, signature=str(ter_metric.get_signature()))
    if tokenize == MOSES:
        result["label"] = MOSES_LABEL if lowercase else MOSES_LABEL.replace("lowercased, ", "cased, ")
    return result


def format_sacrebleu(result: dict[str, Any]) -> str:
    """sacreBLEU's own text lines: `BLEU|signature = score details`, then chrF (and TER)."""
    lines = ([f"# {result['label']}"] if "label" in result else []) + [result["bleu_verbose"], result["chrf_verbose"]]
    if "ter_verbose" in result:
        lines.append(result["ter_verbose"])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The paper's tokenized, compound-split BLEU
# ---------------------------------------------------------------------------------------


def compound_split(line: str) -> str:
    """Split hyphenated compounds as get_ende_bleu.sh does: one pass of the ##AT## regex."""
    return COMPOUND_RE.sub(COMPOUND_SUB, line)


def moses_tokenize(lines: Iterable[str], lang: str) -> list[str]:
    """`tokenizer.perl -l LANG` with its defaults: HTML escaping on, no aggressive dash split.

    These are the settings of tensor2tensor's get_ende_bleu.sh; with them the reference side
    of newstest2014.de counts the 64,496 tokens fairseq's README reports.
    """
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, escape=True, aggressive_dash_splits=False, return_str=True) for line in lines]


@dataclass(frozen=True)
class MultiBleu:
    """Corpus BLEU as multi-bleu.perl computes and prints it (precisions in percent)."""

    bleu: float
    precisions: tuple[float, float, float, float]
    bp: float
    ratio: float
    hyp_len: int
    ref_len: int

    def format(self) -> str:
        """multi-bleu.perl's output line."""
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (
            f"BLEU = {self.bleu:.2f}, {p} (BP={self.bp:.3f}, ratio={self.ratio:.3f}, "
            f"hyp_len={self.hyp_len}, ref_len={self.ref_len})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": "compound_split_bleu",
            "note": COMPOUND_SPLIT_LABEL,
            "bleu": self.bleu,
            "precisions": list(self.precisions),
            "bp": self.bp,
            "ratio": self.ratio,
            "hyp_len": self.hyp_len,
            "ref_len": self.ref_len,
            "multi_bleu": self.format(),
        }


def multi_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> MultiBleu:
    """BLEU-4 on already tokenized text, exactly as multi-bleu.perl.

    multi-bleu.perl splits on whitespace, clips n-gram counts by the maximum count over the
    references, takes the closest reference length (the shorter one on ties), uses no
    smoothing (any zero precision gives 0) and BP = exp(1 - r/c) when c < r. sacreBLEU with
    tokenize='none' and smooth_method='none' computes exactly these statistics.
    """
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    score = metric.corpus_score(list(hypotheses), [list(r) for r in references])
    if score.ref_len == 0:
        raise NmtError("the references are empty (0 tokens); nothing to score against")
    # multi-bleu prints correct/total per order, 0 where an order has no n-grams at all.
    precisions = tuple(100.0 * c / t if t else 0.0 for c, t in zip(score.counts, score.totals))
    return MultiBleu(
        bleu=score.score,
        precisions=precisions,  # type: ignore[arg-type]
        bp=score.bp,
        ratio=score.sys_len / score.ref_len,
        hyp_len=score.sys_len,
        ref_len=score.ref_len,
    )


def compound_split_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]], lang: str = "de") -> MultiBleu:
    """The paper's WMT14 En-De BLEU from detokenized text: Moses tokenize, ##AT## split, multi-bleu."""
    hyps = [compound_split(line) for line in moses_tokenize(hypotheses, lang)]
    refs = [[compound_split(line) for line in moses_tokenize(r, lang)] for r in references]
    return multi_bleu(hyps, refs)
