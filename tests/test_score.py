"""`nmt score`: sacreBLEU's numbers exactly, and the paper's compound-split BLEU by hand."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.score import compound_split, compound_split_bleu, moses_tokenize, multi_bleu
from nmt.data.textio import read_lines


def sacrebleu_cli(*args: str) -> list[dict]:
    """The `sacrebleu` command line of the same environment, as JSON."""
    exe = Path(sys.executable).parent / "sacrebleu"
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "sacrebleu"]
    proc = subprocess.run([*cmd, *map(str, args), "-f", "json", "-w", "4"], capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    return out if isinstance(out, list) else [out]


def perturb(lines: list[str], seed: int) -> list[str]:
    """A 'system output': drop, swap and replace some words."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        if len(words) > 3 and rng.random() < 0.5:
            del words[rng.randrange(len(words))]
        if len(words) > 3 and rng.random() < 0.4:
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
        if words and rng.random() < 0.3:
            words[rng.randrange(len(words))] = "Hund"
        out.append(" ".join(words))
    return out


@pytest.fixture(scope="module")
def multi30k_files(multi30k_dir: Path, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("score")
    ref = list(read_lines(multi30k_dir / "test_2016_flickr.de.gz"))[:300]
    files = {"ref": d / "ref.de", "ref2": d / "ref2.de", "hyp": d / "hyp.de"}
    files["ref"].write_text("\n".join(ref) + "\n", encoding="utf-8")
    files["ref2"].write_text("\n".join(perturb(ref, 2)) + "\n", encoding="utf-8")
    files["hyp"].write_text("\n".join(perturb(ref, 1)) + "\n", encoding="utf-8")
    return files


def test_score_gives_exactly_the_numbers_of_the_sacrebleu_command_line(multi30k_files):
    f = multi30k_files
    proc = run_nmt("score", "--ref", f["ref"], "--json", "--ter", input=f["hyp"].read_bytes())
    assert proc.returncode == 0, proc.stderr
    ours = json.loads(proc.stdout)
    bleu, chrf, ter = sacrebleu_cli(f["ref"], "-i", f["hyp"], "-m", "bleu", "chrf", "ter")
    assert 10 < ours["bleu"] < 90
    assert round(ours["bleu"], 4) == bleu["score"]
    assert ours["signature"] == bleu["signature"]
    assert round(ours["chrf"], 4) == chrf["score"]
    assert ours["chrf_signature"] == chrf["signature"]
    assert round(ours["ter"], 4) == ter["score"]
    assert ours["ter_signature"] == ter["signature"]
    precisions = "/".join(f"{p:.1f}" for p in ours["precisions"])
    assert bleu["verbose_score"] == (f"{precisions} (BP = {ours['bp']:.3f} ratio = {ours['ratio']:.3f} "
                                     f"hyp_len = {ours['hyp_len']} ref_len = {ours['ref_len']})")


def test_several_references_tokenizer_and_lowercase_match_sacrebleu(multi30k_files):
    f = multi30k_files
    proc = run_nmt("score", "--hyp", f["hyp"], "--ref", f["ref"], "--ref", f["ref2"],
                   "--tokenize", "intl", "--lowercase", "--json")
    assert proc.returncode == 0, proc.stderr
    ours = json.loads(proc.stdout)
    bleu, chrf = sacrebleu_cli(f["ref"], f["ref2"], "-i", f["hyp"], "-m", "bleu", "chrf",
                               "-tok", "intl", "-lc", "--chrf-lowercase")
    assert round(ours["bleu"], 4) == bleu["score"]
    assert ours["signature"] == bleu["signature"]
    assert "nrefs:2" in ours["signature"] and "tok:intl" in ours["signature"] and "case:lc" in ours["signature"]
    assert round(ours["chrf"], 4) == chrf["score"]
    assert ours["chrf_signature"] == chrf["signature"]


def test_text_output_shows_bleu_with_its_signature_and_chrf(multi30k_files):
    f = multi30k_files
    proc = run_nmt("score", "--ref", f["ref"], input=f["hyp"].read_bytes())
    assert proc.returncode == 0, proc.stderr
    bleu_line, chrf_line = proc.stdout.splitlines()
    assert bleu_line.startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert chrf_line.startswith("chrF2|nrefs:1|")


def test_line_count_mismatch_names_both_counts_and_files(multi30k_files, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("ein Hund\nzwei Hunde\n", encoding="utf-8")
    proc = run_nmt("score", "--ref", multi30k_files["ref"], "--hyp", short)
    assert_one_line_error(proc, "2 hypotheses", str(short), "300 references", str(multi30k_files["ref"]))
    proc = run_nmt("score", "--ref", multi30k_files["ref"], "--compound-split", input="ein Hund\n")
    assert_one_line_error(proc, "1 hypotheses", "<stdin>", "300 references")


def test_user_errors_are_one_line(tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("ein Hund\n", encoding="utf-8")
    assert_one_line_error(run_nmt("score", "--ref", tmp_path / "missing.de", input="x\n"), "missing.de")
    assert_one_line_error(run_nmt("score", "--ref", ref, "--tokenize", "perl", input="x\n"), "--tokenize", "13a", "moses")
    assert_one_line_error(run_nmt("score", "--ref", ref, input=b"\xff\xfe\n"), "invalid UTF-8", "<stdin>", "line 1")
    assert_one_line_error(run_nmt("score", "--ref", ref, "--compound-split", "--lowercase", input="x\n"), "--compound-split")


# --- the paper's tokenized, compound-split BLEU ------------------------------------------

HYPS = ["Das ist ein Test-Fall.", "Er kommt morgen."]
REFS = ["Das ist kein Test-Fall.", "Er kommt heute, sagt sie."]


def test_compound_split_is_one_pass_of_the_atat_regex():
    assert compound_split("rich-text format") == "rich ##AT##-##AT## text format"
    # one non-overlapping pass: the middle "b" was consumed by the first match
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert compound_split("- a - b") == "- a - b"


def test_lowercased_moses_bleu_is_multi_bleu_on_lowercased_tokenized_text(multi30k_files, tmp_path):
    """`--tokenize moses --lowercase`: the Multi30k papers' BLEU, labelled and signed as such."""
    proc = run_nmt("score", "--ref", multi30k_files["ref"], "--hyp", multi30k_files["hyp"], "--tokenize", "moses",
                   "--lowercase", "--lang", "de", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    hyps = [l.lower() for l in multi30k_files["hyp"].read_text(encoding="utf-8").splitlines()]
    refs = [l.lower() for l in multi30k_files["ref"].read_text(encoding="utf-8").splitlines()]
    expected = multi_bleu(moses_tokenize(hyps, "de"), [moses_tokenize(refs, "de")])
    assert got["bleu"] == pytest.approx(expected.bleu, abs=1e-9)
    assert "case:lc" in got["signature"] and "tok:moses-de" in got["signature"] and "Wu et al." in got["label"]
    cased = json.loads(run_nmt("score", "--ref", multi30k_files["ref"], "--hyp", multi30k_files["hyp"], "--tokenize",
                               "moses", "--lang", "de", "--json").stdout)
    cased_hyps, cased_refs = (multi30k_files[k].read_text(encoding="utf-8").splitlines() for k in ("hyp", "ref"))
    assert cased["bleu"] == pytest.approx(multi_bleu(moses_tokenize(cased_hyps, "de"), [moses_tokenize(cased_refs, "de")]).bleu)
    assert "case:mixed" in cased["signature"] and cased["label"].startswith("cased, ")
    text = run_nmt("score", "--ref", multi30k_files["ref"], "--hyp", multi30k_files["hyp"], "--tokenize", "moses", "-lc",
                   "-l", "de").stdout
    assert text.startswith("# lowercased, Moses-tokenized BLEU") and f"= {got['bleu']:.2f}" in text


def test_lang_defaults_to_the_runs_target_language_else_german(tmp_path):
    """`--help` says so: plain files take German Moses rules (not English), a run dir its own target."""
    (tmp_path / "hyp").write_text("Ein Mann fährt Rad.\n", encoding="utf-8")
    plain = run_nmt("score", "--ref", tmp_path / "hyp", "--hyp", tmp_path / "hyp", "-tok", "moses", "--json", cwd=tmp_path)
    assert "tok:moses-de" in json.loads(plain.stdout)["signature"], plain.stderr
    (tmp_path / "run" / "config").mkdir(parents=True)
    (tmp_path / "run" / "config" / "preprocess.json").write_text(json.dumps({"source_lang": "en", "target_lang": "fr"}))
    run = run_nmt("score", "--ref", tmp_path / "hyp", "--hyp", tmp_path / "hyp", "-tok", "moses", "--json",
                  "-r", tmp_path / "run")
    assert "tok:moses-fr" in json.loads(run.stdout)["signature"], run.stderr


def test_moses_tokenization_is_tokenizer_perl_with_default_escaping():
    assert moses_tokenize(HYPS, "de") == ["Das ist ein Test-Fall .", "Er kommt morgen ."]
    assert moses_tokenize(['Er sagt "Hallo" & geht.'], "de") == ["Er sagt &quot; Hallo &quot; &amp; geht ."]


def test_compound_split_bleu_matches_hand_counted_ngrams():
    # Tokenized and split:
    #   hyp 1: Das ist ein Test ##AT##-##AT## Fall .      (7 tokens)
    #   ref 1: Das ist kein Test ##AT##-##AT## Fall .     (7 tokens)
    #   hyp 2: Er kommt morgen .                          (4 tokens)
    #   ref 2: Er kommt heute , sagt sie .                (7 tokens)
    # Matches per order, sentence 1 + sentence 2:
    #   1-grams: 6/7 (all but "ein")                      + 3/4 (Er, kommt, .)      = 9/11
    #   2-grams: 4/6 (Das ist, Test ##AT.., ..## Fall, Fall .) + 1/3 (Er kommt)     = 5/9
    #   3-grams: 2/5 (Test ## Fall, ## Fall .)            + 0/2                     = 2/7
    #   4-grams: 1/4 (Test ##AT##-##AT## Fall .)          + 0/1                     = 1/5
    # hyp_len 11 < ref_len 14, so BP = exp(1 - 14/11).
    result = compound_split_bleu(HYPS, [REFS], lang="de")
    bp = math.exp(1 - 14 / 11)
    bleu = 100 * bp * (9 / 11 * 5 / 9 * 2 / 7 * 1 / 5) ** 0.25
    assert result.hyp_len == 11 and result.ref_len == 14
    assert result.precisions == pytest.approx((100 * 9 / 11, 100 * 5 / 9, 100 * 2 / 7, 100 * 1 / 5))
    assert result.bp == pytest.approx(bp)
    assert result.bleu == pytest.approx(bleu)
    assert result.format() == "BLEU = 30.56, 81.8/55.6/28.6/20.0 (BP=0.761, ratio=0.786, hyp_len=11, ref_len=14)"


def test_multi_bleu_has_no_smoothing_a_zero_precision_gives_zero():
    # sentence 2 alone: no 3-gram or 4-gram matches, so multi-bleu.perl prints BLEU = 0.00
    result = multi_bleu(["Er kommt morgen ."], [["Er kommt heute , sagt sie ."]])
    assert result.bleu == 0.0
    assert result.format() == "BLEU = 0.00, 75.0/33.3/0.0/0.0 (BP=0.472, ratio=0.571, hyp_len=4, ref_len=7)"


def test_multi_bleu_takes_the_closest_reference_length_and_max_clipped_counts():
    # hyp 4 tokens; references of 3 and 5 tokens are equally close: the shorter one counts.
    result = multi_bleu(["a a b c"], [["a b c"], ["a a x y z"]])
    assert result.ref_len == 3
    # "a" twice is allowed by the second reference: 4/4 unigrams
    assert result.precisions[0] == 100.0


def test_compound_split_cli_prints_multi_bleu_format_clearly_labelled(tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    proc = run_nmt("score", "--ref", ref, "--compound-split", input="\n".join(HYPS) + "\n")
    assert proc.returncode == 0, proc.stderr
    label, line = proc.stdout.splitlines()
    assert "NOT comparable to sacreBLEU" in label and "compound-split" in label
    assert line == "BLEU = 30.56, 81.8/55.6/28.6/20.0 (BP=0.761, ratio=0.786, hyp_len=11, ref_len=14)"
    proc = run_nmt("score", "--ref", ref, "--compound-split", "--json", input="\n".join(HYPS) + "\n")
    out = json.loads(proc.stdout)
    assert out["metric"] == "compound_split_bleu" and out["ref_len"] == 14
    assert out["bleu"] == pytest.approx(30.56, abs=0.005)


def test_newstest2014_reference_counts_64496_compound_split_tokens(wmt14_dir):
    # The reference length fairseq's scaling_nmt README prints for this metric.
    ref = list(read_lines(wmt14_dir / "newstest2014.de.gz"))
    result = compound_split_bleu(ref, [ref], lang="de")
    assert result.ref_len == 64496
    assert result.hyp_len == 64496
    assert result.bleu == pytest.approx(100.0)
