"""Subword regularization (`nmt preprocess --subword-samples`, one sampled segmentation per epoch
in `nmt train`): the samples are the same text cut differently, reproducible from the seed
whatever the number of workers, and a run trained on them resumes bit-identically."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.data.token_arrays import TokenArray
from nmt.data.tokenizer import load_tokenizer
from nmt.preprocess.subword_sampling import SegmentationSampler, sample_for_epoch, sentencepiece_kind
from test_resume import assert_bit_identical, logged, train_killing_at_random_moments
from test_train import TINY, write_corpus

SAMPLES = 3


def _multi30k_text(multi30k_dir: Path, folder: Path, n: int = 2000) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name, count in (("train", "train", n), ("valid", "val", 100)):
        for lang in ("en", "de"):
            with gzip.open(multi30k_dir / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [line for _, line in zip(range(count), f)]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def _preprocess(text: Path, run: Path, *flags: str) -> dict:
    proc = run_nmt("preprocess", "-r", run, "-s", "en", "-t", "de", "--trainpref", text / "train",
                   "--validpref", text / "valid", "--vocab-size", "1000", *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads((run / "config/preprocess.json").read_text(encoding="utf-8"))


def _sentences(run: Path, split: str, lang: str, record: dict) -> list[list[int]]:
    arr = TokenArray(run / "data", split, lang, record["dtype"])
    return [arr[i].tolist() for i in range(len(arr))]


@pytest.fixture(scope="module")
def text(multi30k_dir, tmp_path_factory) -> Path:
    return _multi30k_text(multi30k_dir, tmp_path_factory.mktemp("sampling") / "text")


@pytest.mark.parametrize("vocab_type", ["bpe", "unigram"])
def test_samples_decode_to_the_same_text_differ_and_come_back_from_the_seed(text, tmp_path, vocab_type):
    one = _preprocess(text, tmp_path / "one", "--vocab-type", vocab_type, "--subword-samples", str(SAMPLES),
                      "--subword-alpha", "0.1", "--workers", "1")
    assert one["subword_sampling"]["splits"] == [f"train.sample{k}" for k in range(1, SAMPLES + 1)]
    assert one["subword_sampling"]["method"].startswith("BPE-dropout" if vocab_type == "bpe" else "unigram")
    tok = load_tokenizer(tmp_path / "one" / one["vocab"]["en"])
    plain = _sentences(tmp_path / "one", "train", "en", one)
    samples = [_sentences(tmp_path / "one", f"train.sample{k}", "en", one) for k in range(1, SAMPLES + 1)]
    text_of = tok.decode(plain)
    for sample in samples:
        assert len(sample) == len(plain)  # the same kept pairs, in the same order
        assert tok.decode(sample) == text_of  # the same text, cut differently
        cut_otherwise = sum(a != b for a, b in zip(sample, plain))
        assert cut_otherwise > 0.3 * len(plain), cut_otherwise
    assert sum(a != b for a, b in zip(samples[0], samples[1])) > 0.3 * len(plain)  # samples differ from each other
    # sampled segmentations use more, shorter pieces; the record says how many tokens each epoch costs
    assert one["summary"]["splits"]["train"]["samples"]["train.sample1"]["en"] == sum(map(len, samples[0]))
    assert sum(map(len, samples[0])) > sum(map(len, plain))
    # the target keeps the deterministic segmentation, the one the decoder learns to write
    assert one["subword_sampling"]["sides"] == "source"
    for k in range(1, SAMPLES + 1):
        for ext in ("bin", "idx"):
            assert (tmp_path / f"one/data/train.sample{k}.de.{ext}").read_bytes() == (tmp_path / f"one/data/train.de.{ext}").read_bytes()
    # validation keeps the deterministic segmentation
    assert not list((tmp_path / "one" / "data").glob("valid.sample*"))

    # the same seed gives the same files with any number of workers; another seed others
    # (one's vocabulary: SentencePiece's unigram training itself varies with its thread count)
    two = _preprocess(text, tmp_path / "two", "--vocab-type", vocab_type, "--subword-samples", str(SAMPLES),
                      "--subword-alpha", "0.1", "--workers", "2", "--vocab", str(tmp_path / "one"))
    other = _preprocess(text, tmp_path / "other", "--vocab-type", vocab_type, "--subword-samples", str(SAMPLES),
                        "--subword-alpha", "0.1", "--workers", "1", "--seed", "2")
    for k in range(1, SAMPLES + 1):
        for lang in ("en", "de"):
            name = f"train.sample{k}.{lang}.bin"
            assert (tmp_path / "one/data" / name).read_bytes() == (tmp_path / "two/data" / name).read_bytes(), name
    # another seed cuts anew (the vocabulary, learned from all pairs here, and the deterministic ids stay)
    assert (tmp_path / "one/data/train.de.bin").read_bytes() == (tmp_path / "other/data/train.de.bin").read_bytes()
    assert (tmp_path / "one/data/train.sample1.en.bin").read_bytes() != (tmp_path / "other/data/train.sample1.en.bin").read_bytes()
    assert two["summary"]["splits"] == one["summary"]["splits"]


def test_bpe_dropout_without_dropout_is_sentencepieces_bpe_and_unigram_sampling_peaks_at_viterbi(text, tmp_path):
    """The samplers are SentencePiece's segmentations made random: BPE-dropout at alpha 0 is its
    BPE encoding, and unigram sampling at a very low temperature its Viterbi segmentation."""
    import sentencepiece as spm

    lines = [*(text / "train.en").read_text(encoding="utf-8").splitlines(),
             *(text / "train.de").read_text(encoding="utf-8").splitlines()]
    for vocab_type, alpha, least in (("bpe", 0.0, 1.0), ("unigram", 1000.0, 0.995)):
        run = tmp_path / vocab_type
        record = _preprocess(text, run, "--vocab-type", vocab_type)
        model = str(run / record["vocab"]["en"])
        sp = spm.SentencePieceProcessor(model_file=model)
        assert sentencepiece_kind(sp) == vocab_type
        same = sum(a == b for a, b in zip(SegmentationSampler(model, alpha).encode(lines, seed=1), sp.encode(lines)))
        assert same >= least * len(lines), (vocab_type, same, len(lines))  # unigram: ties may be broken otherwise


def test_a_run_recorded_with_the_removed_subword_sides_setting_is_the_same_when_it_sampled_the_source_only(text, tmp_path):
    """Runs made while `--subword-sides` existed record it: "source" made what nmt makes now,
    "both" sampled the targets too, so it is another result, replaced only with --force."""
    run = tmp_path / "run"
    flags = ["--subword-samples", "2", "--workers", "1"]
    _preprocess(text, run, *flags)
    record_path = run / "config/preprocess.json"
    record = json.loads(record_path.read_text(encoding="utf-8"))
    for sides in ("source", "both"):
        record["settings"]["subword_sides"] = sides
        record_path.write_text(json.dumps(record), encoding="utf-8")
        proc = run_nmt("preprocess", "-r", run, "-s", "en", "-t", "de", "--trainpref", text / "train",
                       "--validpref", text / "valid", "--vocab-size", "1000", *flags)
        if sides == "source":
            assert proc.returncode == 0 and "nothing to do" in proc.stderr + proc.stdout, proc.stderr
        else:
            assert_one_line_error(proc, "other settings", "subword_sides 'both'", "--force")


def test_epochs_cycle_through_the_samples():
    assert [sample_for_epoch(e, 3) for e in range(1, 8)] == [1, 2, 3, 1, 2, 3, 1]
    assert sample_for_epoch(5, 0) == 0


def test_what_cannot_sample_is_refused_in_one_line(text, tmp_path):
    proc = run_nmt("preprocess", "-r", tmp_path / "wp", "-s", "en", "-t", "de", "--trainpref", text / "train",
                   "--vocab-type", "wordpiece", "--vocab-size", "1000", "--subword-samples", "2")
    assert_one_line_error(proc, "--subword-samples", "WordPiece", "bpe")
    assert not (tmp_path / "wp").exists()
    wordpiece = tmp_path / "wp-run"
    _preprocess(text, wordpiece, "--vocab-type", "wordpiece")
    proc = run_nmt("preprocess", "-r", tmp_path / "copied", "-s", "en", "-t", "de", "--trainpref", text / "train",
                   "--vocab", wordpiece, "--vocab-type", "wordpiece", "--subword-samples", "2")
    assert_one_line_error(proc, "--subword-samples", "wordpiece")
    assert not (tmp_path / "copied").exists()
    proc = run_nmt("preprocess", "-r", tmp_path / "a", "-s", "en", "-t", "de", "--trainpref", text / "train",
                   "--subword-samples", "2", "--subword-alpha", "0")
    assert_one_line_error(proc, "--subword-alpha")


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sampled")
    write_corpus(root / "text", n_train=200)
    run = root / "run"
    proc = run_nmt("preprocess", "-r", run, "-s", "en", "-t", "de", "--trainpref", root / "text/train",
                   "--validpref", root / "text/valid", "--vocab-size", "100", "--workers", "1",
                   "--subword-samples", str(SAMPLES), "--subword-alpha", "0.3")
    assert proc.returncode == 0, proc.stderr
    return run


def test_a_run_on_sampled_segmentations_resumes_bit_identically_mid_epoch(sampled_run, tmp_path):
    args = [*TINY, "--seed", "5", "--log-interval", "1", "--save-interval-updates", "3", "--keep-last", "-1",
            "--max-tokens", "192", "--max-epoch", "4"]
    once, killed = shutil.copytree(sampled_run, tmp_path / "once"), tmp_path / "killed"
    proc = run_nmt("train", "-r", once, *args)
    assert proc.returncode == 0, proc.stderr
    assert "subword sampling: epoch e trains on train.samplek" in " ".join(proc.stderr.split())
    assert train_killing_at_random_moments(sampled_run, killed, args, random.Random(5), kills=1) == 1  # once proves the resume
    assert_bit_identical(once, killed)
    assert logged(once) == logged(killed)

    # every epoch trained on its own sample: updates per epoch follow each sample's lengths, not the deterministic one's
    records = [json.loads(line) for line in (once / "logs/train.jsonl").read_text().splitlines()]
    per_epoch = np.bincount([r["epoch"] for r in records if r["kind"] == "train"])[1:]
    plain = shutil.copytree(sampled_run, tmp_path / "plain")
    assert run_nmt("train", "-r", plain, *args, "--no-subword-sampling").returncode == 0
    plain_records = [json.loads(line) for line in (plain / "logs/train.jsonl").read_text().splitlines()]
    plain_per_epoch = np.bincount([r["epoch"] for r in plain_records if r["kind"] == "train"])[1:]
    assert len(set(plain_per_epoch)) == 1  # one segmentation: the same number of batches every epoch
    assert per_epoch[0] != per_epoch[1] or per_epoch[1] != per_epoch[2]
    assert per_epoch[3] == per_epoch[0]  # epoch 4 is sample 1 again
    assert (per_epoch > plain_per_epoch).all()  # sampled cuts are longer
    train_json = json.loads((once / "config/train.json").read_text(encoding="utf-8"))
    assert train_json["subword_samples"] == SAMPLES
