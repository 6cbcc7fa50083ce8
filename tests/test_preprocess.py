"""`nmt preprocess`: vocabulary, binarized data, summary, and bad input that leaves no trace."""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import sys
import unicodedata
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.preprocess.cleaning import CleaningRules, count_reasons, drop_codes
from nmt.data.token_arrays import TokenArray
from nmt.errors import NmtError
from nmt.preprocess.pipeline import PreprocessConfig, run_preprocess
from nmt.preprocess.cached_bpe import BpeWordCache
from nmt.preprocess.vocab_sample import UniformSample
from nmt.data.textio import decode_block
from nmt.data.tokenizer import UNK_ID, load_tokenizer


# -- helpers ---------------------------------------------------------------------------------

def read_gz_lines(path: Path) -> list[str]:
    return gzip.open(path, "rb").read().decode("utf-8").split("\n")[:-1]


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))


def normalized(line: str) -> str:
    """What decoding gives back (see nmt.preprocess.pipeline): NFKC, whitespace collapsed and stripped."""
    return " ".join(unicodedata.normalize("NFKC", line).split())


def snapshot(root: Path):
    """Every file and folder under `root` with size and mtime; None when `root` does not exist."""
    if not root.exists():
        return None
    return sorted((str(p.relative_to(root)), p.is_dir(), p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
                  for p in root.rglob("*"))


def record(run: Path) -> dict:
    return json.loads((run / "config" / "preprocess.json").read_text())


def decoded_split(run: Path, split: str, lang: str) -> tuple[list[str], list[bool]]:
    """Decode the stored ids of a split side with the stored vocabulary; also which lines hold <unk>."""
    rec = record(run)
    tok = load_tokenizer(run / rec["vocab"][lang])
    arr = TokenArray(run / "data", split, lang, rec["dtype"])
    ids = [arr[i].tolist() for i in range(len(arr))]
    return tok.decode(ids), [UNK_ID in seq for seq in ids]


LANGS = ("-s", "en", "-t", "de")


@pytest.fixture(scope="module")
def multi30k_run(multi30k_dir, tmp_path_factory):
    """Multi30k en->de, joint BPE 8000: the issue's reference run, shared by several tests."""
    run = tmp_path_factory.mktemp("m30k") / "run"
    proc = run_nmt("preprocess", *LANGS, "--trainpref", multi30k_dir / "train", "--validpref", multi30k_dir / "val",
                   "--testpref", multi30k_dir / "test_2016_flickr", "--vocab-size", "8000", "-r", run)
    assert proc.returncode == 0, proc.stderr
    return run, proc


@pytest.fixture(scope="module")
def small(multi30k_dir, tmp_path_factory) -> Path:
    """The first 2000 training and 200 validation pairs of Multi30k as plain text: PREFIX = small/{train,valid}."""
    d = tmp_path_factory.mktemp("small")
    for lang in ("en", "de"):
        write_lines(d / f"train.{lang}", read_gz_lines(multi30k_dir / f"train.{lang}.gz")[:2000])
        write_lines(d / f"valid.{lang}", read_gz_lines(multi30k_dir / f"val.{lang}.gz")[:200])
    return d


# -- the reference run -------------------------------------------------------------------------

def test_multi30k_bpe_joined_gives_29000_1014_1000_pairs(multi30k_run):
    run, proc = multi30k_run
    rec = record(run)
    assert {s: v["pairs"] for s, v in rec["splits"].items()} == {"train": 29000, "valid": 1014, "test": 1000}
    assert rec["source_lang"] == "en" and rec["target_lang"] == "de" and rec["joined"] is True
    assert rec["vocab_type"] == "bpe" and rec["vocab"] == {"en": "vocab/joint.model", "de": "vocab/joint.model"}
    assert rec["vocab_sizes"] == {"en": 8000, "de": 8000} and rec["dtype"] == "uint16" and rec["moses"] is False
    for split, n in (("train", 29000), ("valid", 1014), ("test", 1000)):
        for lang in ("en", "de"):
            arr = TokenArray(run / "data", split, lang, "uint16")
            assert len(arr) == n and arr.sizes.min() > 0 and arr.tokens.max() < 8000
    # The summary table on stderr shows the pair counts.
    for n in ("29,000", "1,014", "1,000"):
        assert n in proc.stderr
    assert rec["summary"]["splits"]["train"]["dropped"] == {"empty": 0, "too_short": 0, "too_long": 0, "ratio": 0}


@pytest.mark.parametrize("split,prefix", [("valid", "val"), ("test", "test_2016_flickr")])
def test_decoding_stored_ids_gives_back_the_input_text(multi30k_run, multi30k_dir, split, prefix):
    run, _ = multi30k_run
    for lang in ("en", "de"):
        original = read_gz_lines(multi30k_dir / f"{prefix}.{lang}.gz")
        decoded, has_unk = decoded_split(run, split, lang)
        assert len(decoded) == len(original)
        # Lines with a character unseen in training decode with <unk>: few, and counted in the summary.
        assert sum(has_unk) <= 5
        mismatches = [(a, b) for a, b, unk in zip(original, decoded, has_unk) if not unk and normalized(a) != b]
        assert mismatches == []


def test_rerun_with_same_settings_is_a_noop(multi30k_run, multi30k_dir):
    run, _ = multi30k_run
    before = snapshot(run)
    proc = run_nmt("preprocess", *LANGS, "--trainpref", multi30k_dir / "train", "--validpref", multi30k_dir / "val",
                   "--testpref", multi30k_dir / "test_2016_flickr", "-r", run, "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert "already preprocessed with the same settings; nothing to do" in proc.stderr
    assert snapshot(run) == before


def test_rerun_with_other_settings_is_refused_without_force(multi30k_run, multi30k_dir):
    run, _ = multi30k_run
    before = snapshot(run)
    proc = run_nmt("preprocess", *LANGS, "--trainpref", multi30k_dir / "train", "--validpref", multi30k_dir / "val",
                   "--testpref", multi30k_dir / "test_2016_flickr", "--vocab-size", "4000", "-r", run)
    assert_one_line_error(proc, "other settings", "vocab_size 8000 -> 4000", "--force")
    assert snapshot(run) == before


def test_force_replaces_a_result_made_with_other_settings(small, tmp_path):
    run = tmp_path / "run"
    args = ["preprocess", *LANGS, "--trainpref", small / "train", "--validpref", small / "valid", "-r", run]
    assert run_nmt(*args, "--vocab-size", "1000").returncode == 0
    (run / "notes.txt").write_text("mine")
    proc = run_nmt(*args, "--vocab-size", "800", "--vocab-sample-lines", "1500", "--force")
    assert proc.returncode == 0, proc.stderr
    assert record(run)["vocab_sizes"] == {"en": 800, "de": 800}
    assert record(run)["summary"]["vocab"]["sampled_pairs"] == 1500
    assert record(run)["splits"]["train"]["pairs"] == 2000  # the cap is on the vocabulary sample only
    assert (run / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in run.iterdir()) == ["config", "data", "notes.txt", "vocab"]  # no staging left


# -- vocabulary types and options ---------------------------------------------------------------

@pytest.mark.parametrize("vocab_type,joined", [("unigram", True), ("wordpiece", True), ("bpe", False)])
def test_vocab_types_learn_and_round_trip(small, tmp_path, vocab_type, joined):
    run = tmp_path / "run"
    proc = run_nmt("preprocess", *LANGS, "--trainpref", small / "train", "--validpref", small / "valid",
                   "--vocab-type", vocab_type, "--vocab-size", "1000", "--joined" if joined else "--no-joined", "-r", run)
    assert proc.returncode == 0, proc.stderr
    rec = record(run)
    assert rec["vocab_type"] == vocab_type and rec["vocab_sizes"] == {"en": 1000, "de": 1000}
    suffix = ".json" if vocab_type == "wordpiece" else ".model"
    expected = {lang: f"vocab/joint{suffix}" if joined else f"vocab/{lang}{suffix}" for lang in ("en", "de")}
    assert rec["vocab"] == expected
    assert rec["splits"]["train"]["pairs"] == 2000 and rec["splits"]["valid"]["pairs"] == 200
    for lang in ("en", "de"):
        original = (small / f"valid.{lang}").read_text(encoding="utf-8").split("\n")[:-1]
        decoded, has_unk = decoded_split(run, "valid", lang)
        assert sum(has_unk) < 40  # WordPiece maps a whole word with an unseen character to <unk>
        assert [normalized(a) for a, u in zip(original, has_unk) if not u] == [b for b, u in zip(decoded, has_unk) if not u]


def test_gzip_and_plain_input_give_identical_data(small, tmp_path):
    gz = tmp_path / "gz"
    gz.mkdir()
    for lang in ("en", "de"):
        (gz / f"train.{lang}.gz").write_bytes(gzip.compress((small / f"train.{lang}").read_bytes()))
    runs = {}
    for name, prefix in (("plain", small / "train"), ("gz", gz / "train")):
        runs[name] = tmp_path / name / "run"
        proc = run_nmt("preprocess", *LANGS, "--trainpref", prefix, "--vocab-size", "1000", "-r", runs[name])
        assert proc.returncode == 0, proc.stderr
    for f in ("data/train.en.bin", "data/train.en.idx", "data/train.de.bin", "data/train.de.idx"):
        assert (runs["plain"] / f).read_bytes() == (runs["gz"] / f).read_bytes(), f
    # The model files differ only in the (temporary) path SentencePiece records; the pieces are the same.
    plain, gzipped = (load_tokenizer(runs[name] / "vocab" / "joint.model").sp for name in ("plain", "gz"))
    assert [plain.id_to_piece(i) for i in range(1000)] == [gzipped.id_to_piece(i) for i in range(1000)]


def test_reused_vocabulary_gives_the_same_data_and_several_test_sets(multi30k_run, small, tmp_path):
    ref, _ = multi30k_run
    run = tmp_path / "run"
    proc = run_nmt("preprocess", *LANGS, "--trainpref", small / "train", "--testpref",
                   f"{small / 'valid'},{small / 'train'}", "--vocab", ref / "vocab" / "joint.model", "-r", run)
    assert proc.returncode == 0, proc.stderr
    rec = record(run)
    assert rec["splits"]["test"]["pairs"] == 200 and rec["splits"]["test1"]["pairs"] == 2000
    assert (run / "vocab" / "joint.model").read_bytes() == (ref / "vocab" / "joint.model").read_bytes()
    # The first 2000 training pairs get the same ids as in the reference run.
    mine, theirs = TokenArray(run / "data", "train", "de", "uint16"), TokenArray(ref / "data", "train", "de", "uint16")
    assert all(np.array_equal(mine[i], theirs[i]) for i in range(2000))
    assert np.array_equal(TokenArray(run / "data", "test1", "de", "uint16").tokens, mine.tokens)


def test_worker_count_does_not_change_the_data(multi30k_run, small, tmp_path):
    ref, _ = multi30k_run
    for workers in ("1", "2"):
        proc = run_nmt("preprocess", *LANGS, "--trainpref", small / "train", "--validpref", small / "valid",
                       "--vocab", ref / "vocab", "--workers", workers, "-r", tmp_path / workers)
        assert proc.returncode == 0, proc.stderr
    for f in sorted((tmp_path / "1" / "data").iterdir()):
        assert f.read_bytes() == (tmp_path / "2" / "data" / f.name).read_bytes(), f.name


def test_bpe_word_cache_gives_sentencepiece_ids_exactly(multi30k_run, multi30k_dir):
    ref, _ = multi30k_run
    sp = load_tokenizer(ref / "vocab" / "joint.model").sp
    tricky = ["", "   ", " two  dogs ", "caf\u00b4e \u00b4x x\u00b4", "10\u00a0km \u00bd \u338f", "a\x1cb c\u2028d",
              "\u2603\u2603 \u2603 x\u2603y", "\u2581 a\u2581b", "\ufb01ne \uff21\uff22", "\t\tx\r", "e\u0301 \u0301e", "\U0001f600 x"]
    lines = tricky + read_gz_lines(multi30k_dir / "val.de.gz")
    cache = BpeWordCache(sp, max_words=500)  # small: the cache is cleared and refilled on the way
    for dtype in (np.dtype(np.uint16), np.dtype(np.int32)):
        for start in range(0, len(lines), 300):
            chunk = lines[start:start + 300]
            expected = sp.encode(chunk, out_type=int)
            flat, sizes = cache.encode(chunk, dtype)
            assert flat.dtype == dtype and sizes.tolist() == [len(e) for e in expected]
            assert flat.tolist() == [i for e in expected for i in e]
    assert cache.usable and cache.verified and len(cache.cache) <= 500 + 300 * 40
    # A chunk holding the private-use separator itself is encoded whole, still exactly.
    flat, sizes = cache.encode(["a\ue000b", "c"], np.dtype(np.uint16))
    assert flat.tolist() == sum(sp.encode(["a\ue000b", "c"], out_type=int), []) and len(sizes) == 2


def test_moses_tokenizes_before_the_vocabulary_and_postprocess_undoes_it(small, tmp_path):
    from nmt.data.moses import moses_postprocess, moses_preprocess

    lines = ["A man says: \"Hello, world!\"", "Two dogs (brown) play... in the park."]
    assert moses_preprocess(lines, "en") == ['A man says : " Hello , world ! "', "Two dogs ( brown ) play ... in the park ."]
    assert moses_postprocess(moses_preprocess(lines, "en"), "en") == lines
    prefix = tmp_path / "m"
    for lang in ("en", "de"):
        write_lines(prefix.with_name(f"m.{lang}"), (small / f"train.{lang}").read_text(encoding="utf-8").split("\n")[:500] + lines)
    run = tmp_path / "run"
    proc = run_nmt("preprocess", *LANGS, "--trainpref", prefix, "--moses", "--vocab-size", "600", "-r", run)
    assert proc.returncode == 0, proc.stderr
    assert record(run)["moses"] is True
    decoded, _ = decoded_split(run, "train", "en")
    assert decoded[-2:] == moses_preprocess(lines, "en")
    assert moses_postprocess(decoded[-2:], "en") == lines


# -- cleaning ------------------------------------------------------------------------------------

def test_cleaning_drops_train_pairs_by_reason_and_never_filters_valid(multi30k_run, tmp_path):
    ref, _ = multi30k_run
    pairs = [
        ("a man rides a bike", "ein Mann fährt Rad"),           # kept
        ("", "ein leerer Satz"),                               # empty
        ("one two three four five six seven", "eins zwei"),    # too long (max-len 6)
        ("a b c d e", "x"),                                    # ratio 5 > 2
        ("two dogs", "zwei Hunde"),                            # kept
        ("   ", "nur Leerzeichen"),                            # empty (whitespace only)
    ]
    for split in ("train", "valid"):
        for side, lang in enumerate(("en", "de")):
            write_lines(tmp_path / f"{split}.{lang}", [p[side] for p in pairs])
    run = tmp_path / "run"
    proc = run_nmt("preprocess", *LANGS, "--trainpref", tmp_path / "train", "--validpref", tmp_path / "valid",
                   "--vocab", ref / "vocab", "--max-len", "6", "--max-ratio", "2", "-r", run)
    assert proc.returncode == 0, proc.stderr
    summary = record(run)["summary"]["splits"]
    assert summary["train"]["dropped"] == {"empty": 2, "too_short": 0, "too_long": 1, "ratio": 1}
    assert summary["train"]["pairs"] == 2 and record(run)["splits"]["train"]["pairs"] == 2
    decoded, _ = decoded_split(run, "train", "en")
    assert decoded == ["a man rides a bike", "two dogs"]
    # Valid keeps every pair, empty lines included, and says which would have been dropped.
    assert summary["valid"]["pairs"] == 6 and summary["valid"]["dropped"] == {"empty": 0, "too_short": 0, "too_long": 0, "ratio": 0}
    assert summary["valid"]["kept_unfiltered"] == {"empty": 2, "too_short": 0, "too_long": 1, "ratio": 1}
    assert summary["valid"]["sides"]["en"]["empty"] == 2
    assert "4 (empty 2, too long 1, ratio 1)" in proc.stderr


def test_drop_codes_follow_clean_corpus_n():
    rules = CleaningRules(min_len=2, max_len=4, max_ratio=2.0)
    src = ["a b", "", "a", "a b c d e", "a b c d", "a b c", "a  b\tc"]
    tgt = ["x y", "x", "x y", "x y", "x", "x y", "x y z"]
    codes = drop_codes(src, tgt, rules)
    assert count_reasons(codes) == {"empty": 1, "too_short": 2, "too_long": 1, "ratio": 0}
    assert codes.tolist() == [0, 1, 2, 3, 2, 0, 0]
    assert count_reasons(drop_codes(["a b c d e"], ["x y"], CleaningRules(max_ratio=2.0))) == {
        "empty": 0, "too_short": 0, "too_long": 0, "ratio": 1}


def test_vocabulary_sample_is_uniform_exact_and_seeded():
    def draw(seed):
        s = UniformSample(100_000, 1000, seed)
        return np.concatenate([s.take(7_000) for _ in range(15)])[:100_000]
    a = draw(1)
    assert a.sum() == 1000 and np.array_equal(a, draw(1)) and not np.array_equal(a, draw(2))
    per_tenth = a.reshape(10, -1).sum(axis=1)
    assert per_tenth.min() > 60 and per_tenth.max() < 140  # spread over the corpus, not the head
    assert UniformSample(50, 100, 1).take(80).sum() == 50  # a cap above the corpus size takes all


def test_decode_block_splits_on_newline_only_and_names_bad_lines():
    assert decode_block(b"a\r\nb\xe2\x80\xa8c\n\nd", "f", 1) == ["a", "b\u2028c", "", "d"]
    with pytest.raises(Exception, match=r"invalid UTF-8 in f at line 12 \(byte 1\)"):
        decode_block(b"ok\nx\xff\n", "f", 11)
    with pytest.raises(Exception, match="line 40"):
        decode_block(b"ok\n\xff\n", "f", 1, linenos=[7, 40])
    assert decode_block(b"x\xff\n", "f", 1, errors="replace") == ["x\ufffd"]


# -- bad input: one line, run directory untouched ----------------------------------------------

@pytest.fixture()
def existing_run(tmp_path) -> Path:
    run = tmp_path / "existing"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "keep.txt").write_text("x")
    return run


def assert_untouched(tmp_path: Path, existing_run: Path, before, proc, *needles: str) -> None:
    """One-line error, the existing run dir unchanged, a new run dir (and its parent) not created."""
    assert_one_line_error(proc, *needles)
    assert snapshot(existing_run) == before
    assert not (tmp_path / "new").exists()
    assert not [p for p in tmp_path.rglob("*preprocess-tmp*")]


def run_both(tmp_path, existing_run, *args):
    """Run the same failing command into an existing run dir and into one that does not exist."""
    procs = [run_nmt("preprocess", *LANGS, *args, "-r", r) for r in (existing_run, tmp_path / "new" / "run")]
    return procs


def test_line_count_mismatch_names_both_files_and_counts(small, tmp_path, existing_run):
    write_lines(tmp_path / "c.en", ["a", "b", "c"])
    write_lines(tmp_path / "c.de", ["x", "y"])
    before = snapshot(existing_run)
    for proc in run_both(tmp_path, existing_run, "--trainpref", small / "train", "--validpref", tmp_path / "c"):
        assert_untouched(tmp_path, existing_run, before, proc, str(tmp_path / "c.en"), "3 lines", str(tmp_path / "c.de"), "has 2")


def test_invalid_utf8_names_file_and_line_and_replace_goes_on(small, tmp_path, existing_run):
    for lang in ("en", "de"):
        shutil.copy(small / f"valid.{lang}", tmp_path / f"v.{lang}")
    data = bytearray((tmp_path / "v.de").read_bytes())
    third_line = data.index(b"\n", data.index(b"\n") + 1) + 1
    data[third_line + 2] = 0xFF
    (tmp_path / "v.de").write_bytes(bytes(data))
    before = snapshot(existing_run)
    for proc in run_both(tmp_path, existing_run, "--trainpref", small / "train", "--validpref", tmp_path / "v",
                         "--vocab-size", "1000"):
        assert_untouched(tmp_path, existing_run, before, proc, "invalid UTF-8", str(tmp_path / "v.de"), "line 3",
                         "--encoding-errors replace")
    proc = run_nmt("preprocess", *LANGS, "--trainpref", small / "train", "--validpref", tmp_path / "v",
                   "--vocab-size", "1000", "--encoding-errors", "replace", "-r", tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr
    assert record(tmp_path / "ok")["splits"]["valid"]["pairs"] == 200


def test_missing_file_is_one_line(small, tmp_path, existing_run):
    before = snapshot(existing_run)
    for proc in run_both(tmp_path, existing_run, "--trainpref", small / "train", "--testpref", tmp_path / "nope"):
        assert_untouched(tmp_path, existing_run, before, proc, "file not found", str(tmp_path / "nope.en"), "--testpref")


def test_impossible_vocab_size_becomes_advice(small, tmp_path, existing_run):
    before = snapshot(existing_run)
    for proc in run_both(tmp_path, existing_run, "--trainpref", small / "train", "--vocab-size", "100000"):
        assert_untouched(tmp_path, existing_run, before, proc, "--vocab-size 100000", "at most", "smaller --vocab-size")
    for proc in run_both(tmp_path, existing_run, "--trainpref", small / "train", "--vocab-size", "20"):
        assert_untouched(tmp_path, existing_run, before, proc, "--vocab-size 20 is too small", "larger --vocab-size")


def test_empty_corpus_is_one_line(tmp_path, existing_run):
    for lang in ("en", "de"):
        (tmp_path / f"e.{lang}").write_bytes(b"")
    before = snapshot(existing_run)
    for proc in run_both(tmp_path, existing_run, "--trainpref", tmp_path / "e"):
        assert_untouched(tmp_path, existing_run, before, proc, "train corpus is empty")


# -- faults while writing and reading ----------------------------------------------------------

def write_tiny_corpus(prefix: Path, n: int = 300) -> None:
    """`n` pairs of short made-up sentences: enough for a 40-piece vocabulary, no data needed."""
    words = "a man rides a bike across the street two dogs play in the snow while children laugh".split()
    for lang in ("en", "de"):
        write_lines(Path(f"{prefix}.{lang}"), [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 9))
                                               for i in range(n)])


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch, capsys):
    """Writes to an open file raise OSError without a file name; the message must not guess
    'standard output' but name the split file, and leave no run directory behind."""
    from nmt.data.token_arrays import TokenArrayWriter
    from nmt_cli import main as cli

    def full_disk(self, flat, sizes):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    write_tiny_corpus(tmp_path / "c")
    monkeypatch.setattr(TokenArrayWriter, "add", full_disk)
    monkeypatch.setattr(sys, "argv", ["nmt", "preprocess", *LANGS, "--trainpref", str(tmp_path / "c"),
                                      "--vocab-size", "40", "-j", "1", "-r", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1
    assert err.startswith("nmt: error: no space left on device: ") and "free some space" in err
    named = err.removeprefix("nmt: error: no space left on device: ").split(";")[0]
    assert "standard output" not in err
    assert named.startswith(str(tmp_path)) and named.endswith("data/train.en.bin")  # in the run's staging folder
    assert not (tmp_path / "run").exists()


def test_a_truncated_gz_names_the_file_and_its_last_whole_line(tmp_path):
    """The line counted before any heavy work reads 1 MiB blocks; the line named is still the
    last one decompressed whole, not the last block returned (which was 0 for a small file)."""
    write_tiny_corpus(tmp_path / "c", 3000)
    for lang in ("en", "de"):
        data = gzip.compress((tmp_path / f"c.{lang}").read_bytes())
        (tmp_path / f"cut.{lang}.gz").write_bytes(data[: len(data) // 2])
    cut = (tmp_path / "cut.en.gz").read_bytes()
    whole = zlib.decompressobj(wbits=31).decompress(cut).count(b"\n")
    assert 0 < whole < 3000
    cfg = PreprocessConfig(source_lang="en", target_lang="de", trainpref=str(tmp_path / "cut"), vocab_size=40, workers=1)
    with pytest.raises(NmtError) as refused:
        run_preprocess(tmp_path / "run", cfg, progress=False)
    assert str(refused.value).startswith(f"{tmp_path / 'cut.en.gz'} is damaged after line {whole} (truncated: ")
    assert not (tmp_path / "run").exists()
