"""`nmt translate --subset` and `nmt score --subset` use the raw files preprocess recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.data.tokenizer import load_tokenizer
from test_translate import _lines, _save_model


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(l + "\n" for l in lines), encoding="utf-8")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run preprocessed for real (train and test splits) with a random tiny model."""
    data = tmp_path_factory.mktemp("data")
    for split, n, seed in (("train", 300, 0), ("test", 7, 1)):
        _write(data / f"{split}.en", _lines(n, seed))
        _write(data / f"{split}.de", _lines(n, seed + 10))
    run = tmp_path_factory.mktemp("run")
    proc = run_nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", data / "train", "--testpref", data / "test",
                   "--vocab-size", "120", "--workers", "1", "-r", run)
    assert proc.returncode == 0, proc.stderr
    vocab = load_tokenizer(run / "vocab" / "joint.model").vocab_size
    _save_model(run / "checkpoints" / "checkpoint_last.pt", vocab, seed=0)
    return run


def test_translate_subset_test_is_translate_of_the_raw_test_source(run_dir):
    raw = Path(json.loads((run_dir / "config" / "preprocess.json").read_text())["splits"]["test"]["files"]["en"])
    common = ("translate", "--threads", "1", "-r", run_dir, "--max-len-b", "6", "--quiet")
    by_subset = run_nmt(*common, "--subset", "test")
    by_path = run_nmt(*common, "--input", raw)
    assert by_subset.returncode == 0, by_subset.stderr
    assert by_subset.stdout == by_path.stdout
    assert len(by_subset.stdout.splitlines()) == 7


def test_score_subset_test_scores_against_the_raw_test_target(run_dir):
    raw = Path(json.loads((run_dir / "config" / "preprocess.json").read_text())["splits"]["test"]["files"]["de"])
    perfect = run_nmt("score", "-r", run_dir, "--subset", "test", "--json", input=raw.read_bytes())
    assert perfect.returncode == 0, perfect.stderr
    assert json.loads(perfect.stdout)["bleu"] == pytest.approx(100.0)
    hyps = "".join(l + "\n" for l in _lines(7, 99))
    by_subset = run_nmt("score", "-r", run_dir, "--subset", "test", "--json", input=hyps)
    by_ref = run_nmt("score", "--ref", raw, "--lang", "de", "--json", input=hyps)
    assert json.loads(by_subset.stdout) == json.loads(by_ref.stdout)
    assert json.loads(by_subset.stdout)["bleu"] < 100


def test_unknown_subset_and_missing_references_are_one_line_errors(run_dir):
    assert_one_line_error(run_nmt("translate", "-r", run_dir, "--subset", "valid"), "valid", "test")
    assert_one_line_error(run_nmt("score", "-r", run_dir, "--subset", "nope", input="a\n"), "nope")
    assert_one_line_error(run_nmt("score", input="a\n"), "--ref", "--subset")
