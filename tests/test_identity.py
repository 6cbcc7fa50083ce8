"""Checkpoints name the vocabulary they were trained with; translate and average refuse another one."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, run_nmt
from nmt.run.checkpoint import load_checkpoint, save_checkpoint
from nmt.errors import NmtError
from nmt.run.identity import check_identity, checkpoint_identity, run_identity, vocab_sha256
from nmt.model.transformer import Transformer
from nmt.model.config import build_config
from nmt.run.directory import RunDir
from nmt.data.tokenizer import load_tokenizer, train_tokenizer

VOCAB = 60


def make_run(root: Path, words: str, seed: int, with_hash: bool = True) -> Path:
    """A run directory with a BPE vocabulary of exactly VOCAB pieces learned from `words`."""
    rng = random.Random(seed)
    vocab_words = words.split()
    lines = [" ".join(rng.choice(vocab_words) for _ in range(8)) for _ in range(300)]
    model = train_tokenizer("bpe", lines, VOCAB, root / "vocab" / "joint.model", num_threads=1)
    assert load_tokenizer(model).vocab_size == VOCAB
    record = {
        "source_lang": "en", "target_lang": "de", "vocab_type": "bpe", "joined": True,
        "vocab": {"en": "vocab/joint.model", "de": "vocab/joint.model"},
        "vocab_sizes": {"en": VOCAB, "de": VOCAB}, "dtype": "uint16", "moses": False, "splits": {},
    }
    if with_hash:
        digest = vocab_sha256(model)
        record["vocab_sha256"] = {"en": digest, "de": digest}
    RunDir(root).write_record("preprocess", record)
    return root


def save_model(path: Path, seed: int, identity: dict | None, update: int = 10, max_positions: int = 32) -> None:
    torch.manual_seed(seed)
    model = Transformer(build_config("tiny", VOCAB, VOCAB, max_positions=max_positions))
    ckpt = {"model": model.state_dict(), "config": model.cfg.to_dict(), "train_state": {"update": update}}
    if identity is not None:
        ckpt["identity"] = identity
    save_checkpoint(path, ckpt)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two runs whose vocabularies have the same size but other pieces (en-de vs en-fr text)."""
    base = tmp_path_factory.mktemp("runs")
    a = make_run(base / "ende", "ein Mann fährt Fahrrad über die Straße zwei Hunde spielen im Schnee", 0)
    b = make_run(base / "enfr", "un homme fait du vélo dans la rue deux chiens jouent dans la neige", 1)
    for run in (a, b):
        save_model(run / "checkpoints" / "checkpoint_last.pt", 0, run_identity(RunDir(run)))
    return a, b


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_identity_names_languages_hashes_and_sizes(two_runs):
    a, _ = two_runs
    identity = run_identity(RunDir(a))
    pieces = load_tokenizer(a / "vocab" / "joint.model").pieces()
    digest = hashlib.sha256("".join(p + "\n" for p in pieces).encode("utf-8")).hexdigest()
    assert identity == {"source_lang": "en", "target_lang": "de", "vocab_sha256": {"en": digest, "de": digest},
                        "vocab_sizes": {"en": VOCAB, "de": VOCAB}}


def test_a_run_preprocessed_before_hashes_were_recorded_hashes_its_files(two_runs, tmp_path):
    a, _ = two_runs
    old = make_run(tmp_path / "old", "ein Mann fährt Fahrrad über die Straße zwei Hunde spielen im Schnee", 0,
                   with_hash=False)
    # The same data: the same vocabulary, though learned in another folder.
    assert run_identity(RunDir(old)) == run_identity(RunDir(a))


def test_preprocess_records_the_vocabulary_hash(tmp_path):
    for lang, words in (("en", "a man rides a bike"), ("de", "ein Mann fährt Fahrrad")):
        (tmp_path / f"c.{lang}").write_text("\n".join([words] * 50) + "\n")
    proc = run_nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "c", "--vocab-size", "30",
                   "-r", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    record = RunDir(tmp_path / "run").read_record("preprocess")
    digest = vocab_sha256(tmp_path / "run" / "vocab" / "joint.model")
    assert record["vocab_sha256"] == {"en": digest, "de": digest}


def test_translate_refuses_another_runs_checkpoint_of_the_same_size(two_runs):
    a, b = two_runs
    before = snapshot(a)
    proc = run_nmt("translate", "--threads", "1", "-r", a, "-c", b / "checkpoints" / "checkpoint_last.pt",
                   input="ein Mann\n")
    assert_one_line_error(proc, "another vocabulary", "sha256", "checkpoint vs run")
    assert proc.stdout == ""
    assert snapshot(a) == before


def test_translate_with_the_runs_own_checkpoint_says_nothing(two_runs):
    a, _ = two_runs
    proc = run_nmt("translate", "--threads", "1", "-q", "-r", a, "--max-len-b", "3", input="ein Mann\n")
    assert proc.returncode == 0 and proc.stderr == ""


def test_an_old_checkpoint_without_identity_is_checked_by_size_with_a_warning(two_runs, tmp_path):
    a, _ = two_runs
    old = tmp_path / "old.pt"
    save_model(old, 0, identity=None)
    proc = run_nmt("translate", "--threads", "1", "-q", "-r", a, "-c", old, "--max-len-b", "3", input="ein Mann\n")
    assert proc.returncode == 0, proc.stderr
    assert "warning" in proc.stderr and "only its vocabulary sizes could be checked" in proc.stderr
    assert len(proc.stdout.splitlines()) == 1


def test_an_old_checkpoint_of_another_size_is_refused():
    ckpt = {"config": {"src_vocab_size": 100, "tgt_vocab_size": 100}}
    run = {"source_lang": "en", "target_lang": "de", "vocab_sha256": {"en": "a", "de": "a"},
           "vocab_sizes": {"en": VOCAB, "de": VOCAB}}
    with pytest.raises(NmtError, match=f"vocabulary sizes 100/100 vs {VOCAB}/{VOCAB}"):
        check_identity(checkpoint_identity(ckpt), run, "checkpoint x.pt", warn=lambda m: None)


def test_average_refuses_checkpoints_of_different_vocabularies(two_runs, tmp_path):
    a, b = two_runs
    before = snapshot(a)
    proc = run_nmt("average-checkpoints", "-r", a, "--inputs", a / "checkpoints" / "checkpoint_last.pt",
                   b / "checkpoints" / "checkpoint_last.pt", "-o", tmp_path / "avg.pt")
    assert_one_line_error(proc, "different vocabularies")
    assert not (tmp_path / "avg.pt").exists()
    assert snapshot(a) == before


def test_average_into_a_run_refuses_checkpoints_of_another_run(two_runs, tmp_path):
    a, b = two_runs
    other = tmp_path / "b_copy.pt"
    other.write_bytes((b / "checkpoints" / "checkpoint_last.pt").read_bytes())
    before = snapshot(a)
    proc = run_nmt("average-checkpoints", "-r", a, "--inputs", b / "checkpoints" / "checkpoint_last.pt", other)
    assert_one_line_error(proc, "another vocabulary")
    assert snapshot(a) == before


def test_the_average_carries_the_identity_of_its_inputs(two_runs, tmp_path):
    a, _ = two_runs
    ck = a / "checkpoints"
    save_model(tmp_path / "x.pt", 1, run_identity(RunDir(a)))
    proc = run_nmt("average-checkpoints", "-r", a, "--inputs", ck / "checkpoint_last.pt", tmp_path / "x.pt",
                   "-o", tmp_path / "avg.pt")
    assert proc.returncode == 0, proc.stderr
    assert load_checkpoint(tmp_path / "avg.pt")["identity"] == run_identity(RunDir(a))


@pytest.mark.parametrize("name", ["checkpoint_last.pt", "checkpoint_best.pt", "checkpoint3.pt", "checkpoint_1_30.pt"])
def test_average_output_may_not_name_a_file_training_owns(two_runs, tmp_path, name):
    a, _ = two_runs
    ck = a / "checkpoints"
    save_model(tmp_path / "x.pt", 1, run_identity(RunDir(a)))
    before = snapshot(a)
    proc = run_nmt("average-checkpoints", "-r", a, "--inputs", ck / "checkpoint_last.pt", tmp_path / "x.pt",
                   "-o", ck / name)
    assert_one_line_error(proc, "nmt train", "checkpoint_avg.pt")
    assert snapshot(a) == before


def test_average_output_naming_a_folder_is_one_line(two_runs, tmp_path):
    a, _ = two_runs
    proc = run_nmt("average-checkpoints", "-r", a, "--inputs", a / "checkpoints" / "checkpoint_last.pt",
                   a / "checkpoints" / "checkpoint_last.pt", "-o", tmp_path)
    assert_one_line_error(proc, "is a folder", "give a file name")
