"""`nmt translate` answers every input line exactly once, in order, with the run's model."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, run_nmt
from nmt.inference.beam_search import SearchConfig
from nmt.ops.native import native_module
from nmt.run.checkpoint import save_checkpoint
from nmt.run.checkpoint_choice import default_checkpoint
from nmt.run.identity import run_identity
from nmt.model.transformer import Transformer
from nmt.model.config import build_config
from nmt.run.directory import RunDir
from nmt.data.tokenizer import train_tokenizer
from nmt.inference.translator import TranslateConfig, Translator, load_translator

WORDS = ("ein Mann fährt Fahrrad über die Straße . zwei Hunde spielen im Schnee , während Kinder lachen ; "
         "a man rides a bike across the street . two dogs play in the snow while children laugh ! "
         "café déjà vu naïve größer Mädchen").split()


pytestmark = pytest.mark.usefixtures("one_thread")


def _lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for _ in range(n)]


def _save_model(path: Path, vocab: int, seed: int, run: Path | None = None) -> None:
    """A checkpoint as `nmt train` writes it in `run` (default: the run of RUN/checkpoints/path):
    weights, configuration and the run's vocabulary identity."""
    torch.manual_seed(seed)
    model = Transformer(build_config("tiny", vocab, vocab, max_positions=48))
    save_checkpoint(path, {"model": model.state_dict(), "config": model.cfg.to_dict(),
                           "identity": run_identity(RunDir(run or path.parent.parent))})


def _make_run(root: Path, lines: list[str], vocab_size: int) -> Path:
    """A run directory as `nmt preprocess` + `nmt train` leave it, with a random tiny model."""
    from nmt.data.tokenizer import load_tokenizer

    path = train_tokenizer("bpe", lines, vocab_size, root / "vocab" / "joint.model", num_threads=1)
    vocab = load_tokenizer(path).vocab_size
    RunDir(root).write_record("preprocess", {
        "source_lang": "en", "target_lang": "de", "vocab_type": "bpe", "joined": True,
        "vocab": {"en": "vocab/joint.model", "de": "vocab/joint.model"},
        "vocab_sizes": {"en": vocab, "de": vocab}, "dtype": "uint16", "moses": False, "splits": {},
    })
    _save_model(root / "checkpoints" / "checkpoint_last.pt", vocab, seed=0)
    return root


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _make_run(tmp_path_factory.mktemp("run"), _lines(400, 0), 90)


def _input_bytes() -> tuple[bytes, int]:
    """Empty lines, a whitespace-only line, a 5000-word line, a bad UTF-8 byte and a last line without newline."""
    lines = _lines(12, 1)
    raw = [l.encode() for l in lines]
    raw[2] = b""
    raw[5] = b"   "
    raw[7] = " ".join(["Straße"] * 5000).encode()
    raw[9] = b"zwei Hunde \xff\xfe spielen"
    raw[11] = b""
    return b"\n".join(raw) + b"\n" + b"ein Mann", len(raw) + 1


def test_every_line_gets_one_line_in_order_even_empty_long_and_bad_bytes(run_dir):
    data, n_lines = _input_bytes()
    proc = run_nmt("translate", "--threads", "1", "-r", run_dir, "--encoding-errors", "replace", "--max-tokens", "64", input=data)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == n_lines
    assert out[2] == "" and out[5] == "" and out[11] == ""
    assert sum(o != "" for o in out[:-1]) >= n_lines - 3  # a random model may still emit eos first
    warnings = [l for l in proc.stderr.splitlines() if "truncated" in l]
    assert len(warnings) == 1 and "1 line(s)" in warnings[0] and "48 positions" in warnings[0]

    # In order: the same as translating each line on its own through the library.
    translator = load_translator(run_dir, search=SearchConfig(), cfg=TranslateConfig(device="cpu"))
    lines = data.decode("utf-8", errors="replace").split("\n")
    alone = [translator.translate([line])[0].hyp for line in lines]
    assert out[:-1] == alone


def test_a_warning_says_when_every_translation_is_empty(run_dir):
    """With no room for a token (--max-len-a 0 --max-len-b 0) every hypothesis is empty: said, not silent."""
    text = "ein Mann\n\nzwei Hunde\n"
    proc = run_nmt("translate", "--threads", "1", "-r", run_dir, "--max-len-a", "0", "--max-len-b", "0", input=text)
    assert proc.returncode == 0 and proc.stdout == "\n\n\n", proc.stderr
    assert "warning: all 2 non-empty input line(s) got an empty translation" in proc.stderr
    proc = run_nmt("translate", "--threads", "1", "-r", run_dir, input=text)
    assert "empty translation" not in proc.stderr or proc.stdout.strip() == ""
    (run_dir.parent / "empty.de").write_text("\n\n")
    scored = run_nmt("score", "--ref", run_dir.parent / "empty.de", input="\n\n")
    assert scored.returncode == 0 and "warning: all 2 hypotheses in <stdin> are empty" in scored.stderr


def test_invalid_utf8_is_an_error_naming_the_line(run_dir):
    data, _ = _input_bytes()
    # --quiet: from a pipe, the lines before the bad one may be translated (checkpoint named) before it is read.
    assert_one_line_error(run_nmt("translate", "--threads", "1", "-r", run_dir, "--quiet", input=data), "line 10", "--encoding-errors replace")


def test_jsonl_gives_hypothesis_score_and_nbest_per_line(run_dir):
    proc = run_nmt("translate", "--threads", "1", "-r", run_dir, "--format", "jsonl", "--beam", "3", "--nbest", "2", "--quiet",
                   input="ein Mann fährt\n\nzwei Hunde spielen im Schnee\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    rows = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(rows) == 3
    assert rows[1] == {"hyp": "", "score": None, "nbest": []}
    for row in (rows[0], rows[2]):
        assert len(row["nbest"]) == 2
        assert row["nbest"][0] == {"hyp": row["hyp"], "score": row["score"]}
        assert row["nbest"][0]["score"] >= row["nbest"][1]["score"]


def test_text_output_refuses_nbest_above_one(run_dir):
    assert_one_line_error(run_nmt("translate", "--threads", "1", "-r", run_dir, "--nbest", "2", input="a\n"), "--format jsonl")


def test_default_checkpoint_is_avg_then_best_then_last_and_named_on_stderr(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    ckpt = run / "checkpoints"
    assert default_checkpoint(RunDir(run)) == ckpt / "checkpoint_last.pt"
    shutil.copy(ckpt / "checkpoint_last.pt", ckpt / "checkpoint_best.pt")
    assert default_checkpoint(RunDir(run)) == ckpt / "checkpoint_best.pt"
    shutil.copy(ckpt / "checkpoint_last.pt", ckpt / "checkpoint_avg.pt")
    assert default_checkpoint(RunDir(run)) == ckpt / "checkpoint_avg.pt"
    proc = run_nmt("translate", "--threads", "1", "-r", run, "--max-len-b", "2", input="ein Mann\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0].startswith(f"nmt translate: checkpoint {ckpt / 'checkpoint_avg.pt'}; decoder ")


def test_loading_is_timed_apart_from_the_translating_that_sentences_per_second_counts(run_dir):
    """fairseq-generate's convention: sentences/s is the search's rate. Counted from the start,
    it held torch's import and the checkpoint load, which dwarf a small model's translating."""
    proc = run_nmt("translate", "--threads", "1", "-r", run_dir, "--max-len-b", "2", input="ein Mann\nzwei Hunde\n")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert re.search(r"; loaded in [0-9.]+ s$", lines[0]), lines[0]
    assert re.fullmatch(r"nmt translate: 2 lines, \d+ target tokens in [0-9.]+ s \([0-9.]+ sentences/s\)", lines[-1]), lines[-1]


def test_the_first_line_names_the_decoding_path_and_decoder_chooses_it(run_dir):
    """`--decoder native|stock|auto`: the stderr's first line says which step searched; the two
    paths give the same translations (the same maths; scores may differ in their last bits)."""
    lines = "ein Mann fährt Rad\nzwei Hunde spielen im Schnee\n"
    outputs = {}
    for decoder in ("auto", "stock", "native"):
        proc = run_nmt("translate", "--threads", "1", "-r", run_dir, "--decoder", decoder, input=lines)
        first = proc.stderr.splitlines()[0] if proc.stderr else ""
        if decoder == "native" and proc.returncode != 0:  # no compiler here: a one-line refusal
            assert_one_line_error(proc, "--decoder native needs nmt's C++ kernels")
            continue
        assert proc.returncode == 0, proc.stderr
        outputs[decoder] = proc.stdout
        path = {"stock": "stock", "native": "native"}.get(decoder) or ("native" if native_module() is not None else "stock")
        assert f"; decoder {path}: " in first, first
    assert len(set(outputs.values())) == 1
    assert_one_line_error(run_nmt("translate", "-r", run_dir, "--decoder", "fast", input=lines), "--decoder must be one of")


def test_no_checkpoint_and_a_damaged_checkpoint_are_one_line_errors(run_dir, tmp_path):
    empty = tmp_path / "run"
    shutil.copytree(run_dir, empty)
    shutil.rmtree(empty / "checkpoints")
    assert_one_line_error(run_nmt("translate", "--threads", "1", "-r", empty, input="a\n"), "checkpoint_best.pt", "nmt train")

    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes((run_dir / "checkpoints" / "checkpoint_last.pt").read_bytes()[:5000])
    assert_one_line_error(run_nmt("translate", "--threads", "1", "-r", run_dir, "--checkpoint", damaged, input="a\n"), str(damaged), "damaged")


def test_output_is_utf8_whatever_the_locale(tmp_path):
    # A vocabulary of non-ASCII pieces only, so any output of the random model shows the encoding.
    words = "größer Mädchen ÄÖÜ ßüé èñ çå øœ".split()
    rng = random.Random(4)
    run = _make_run(tmp_path / "run", [" ".join(rng.choice(words) for _ in range(6)) for _ in range(300)], 40)
    text = "größer Mädchen"
    proc = run_nmt("translate", "--threads", "1", "-r", run, "--quiet", "--max-len-b", "5", input=f"{text}\n" * 2,
                   env={"LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    want = load_translator(run, search=SearchConfig(max_len_b=5), cfg=TranslateConfig(device="cpu")).translate([text])[0].hyp
    assert any(ord(c) > 127 for c in want)  # the check below means something
    assert proc.stdout.splitlines() == [want] * 2


# -- library ---------------------------------------------------------------------------

def test_batched_translation_equals_one_line_at_a_time(run_dir):
    lines = _lines(12, 2)
    batched = load_translator(run_dir, search=SearchConfig(max_len_b=8), cfg=TranslateConfig(device="cpu", max_tokens=40))
    together = batched.translate(lines)
    for line, tr in zip(lines, together):
        alone = batched.translate([line])[0]
        assert tr.hyp == alone.hyp
        assert tr.score == pytest.approx(alone.score, abs=1e-5)


def test_batches_searched_at_once_give_the_lines_of_one_at_a_time(run_dir):
    """--inter-threads 2: batches run on two worker threads, one thread each; every line, in
    order, with the hypotheses and scores of the batches searched one after another, and
    PyTorch's thread count is back to --threads afterwards."""
    from nmt.inference.config import resolve_inter_threads

    lines = _lines(40, 5)
    cfg = dict(device="cpu", max_tokens=40, threads=2)
    one = load_translator(run_dir, search=SearchConfig(max_len_b=8), cfg=TranslateConfig(**cfg, inter_threads=1))
    two = load_translator(run_dir, search=SearchConfig(max_len_b=8), cfg=TranslateConfig(**cfg, inter_threads=2))
    assert (one.decoder.inter_threads, two.decoder.inter_threads) == (1, 2)
    want, got = one.translate(lines), two.translate(lines)
    assert two.decoder._pool is not None  # the batches did go to the workers
    assert [t.hyp for t in got] == [t.hyp for t in want]
    assert [t.score for t in got] == pytest.approx([t.score for t in want], abs=1e-5)
    assert torch.get_num_threads() == 2
    assert [resolve_inter_threads(0, t, "cpu") for t in (1, 2, 3, 6, 8, 16)] == [1, 2, 3, 3, 4, 4]
    assert resolve_inter_threads(0, 8, "cpu", sampling=True) == 1 and resolve_inter_threads(0, 8, "cuda") == 1


def test_workers_get_a_multiple_of_their_number_of_batches_none_over_max_tokens(run_dir):
    """With 2 workers the lines are cut into an even number of batches of about equal size
    (a last small batch would run alone while the other worker waits), longest lines first,
    each line in one batch, none over --max-tokens padded tokens; one worker keeps the greedy cut."""
    lines = _lines(300, 7) + ["", "x"]
    cfg = dict(device="cpu", max_tokens=200, threads=2)
    two = load_translator(run_dir, cfg=TranslateConfig(**cfg, inter_threads=2))
    one = load_translator(run_dir, cfg=TranslateConfig(**cfg, inter_threads=1))
    ids = two.src_tokenizer.encode(lines)
    balanced, greedy = two.decoder._batches(ids), one.decoder._batches(ids)
    assert len(greedy) % 2 == 1 and len(balanced) == len(greedy) + 1  # the case this is about
    for batches in (balanced, greedy):
        order = [i for batch in batches for i in batch]
        assert sorted(order) == [i for i, seq in enumerate(ids) if seq]
        assert [len(ids[i]) for i in order] == sorted((len(ids[i]) for i in order), reverse=True)
        assert all(len(b) * max(len(ids[i]) + 1 for i in b) <= 200 for b in batches)
    sizes = [len(b) * max(len(ids[i]) + 1 for i in b) for b in balanced]
    assert min(sizes) > 0.5 * max(sizes)


def test_ensemble_of_a_model_with_itself_translates_as_the_model(run_dir, tmp_path):
    ckpt = run_dir / "checkpoints" / "checkpoint_last.pt"
    other = tmp_path / "other.pt"
    _save_model(other, load_translator(run_dir, cfg=TranslateConfig(device="cpu")).src_tokenizer.vocab_size, seed=1,
                run=run_dir)
    lines = _lines(6, 3)
    search = SearchConfig(max_len_b=8)
    single = load_translator(run_dir, [ckpt], search, TranslateConfig(device="cpu")).translate(lines)
    twice = load_translator(run_dir, [ckpt, ckpt], search, TranslateConfig(device="cpu")).translate(lines)
    mixed = load_translator(run_dir, [ckpt, other], search, TranslateConfig(device="cpu")).translate(lines)
    assert [t.hyp for t in twice] == [t.hyp for t in single]
    assert [t.hyp for t in mixed] != [t.hyp for t in single]


def test_stderr_holds_only_nmts_own_lines_and_no_compiler_tooling_is_imported(run_dir):
    """torch's extension builder warns about CUDA_HOME on CPU-only machines as it is imported:
    a translation with the kernels built (or unbuildable) never imports it."""
    proc = run_nmt("translate", "--threads", "1", "-r", run_dir, input="ein Mann\n")
    assert proc.returncode == 0 and proc.stderr, proc.stderr
    assert all(line.startswith("nmt translate: ") for line in proc.stderr.splitlines()), proc.stderr
    code = ("import sys; from nmt.inference.config import TranslateConfig; from nmt.inference.translator import "
            f"load_translator; load_translator({str(run_dir)!r}, cfg=TranslateConfig(device='cpu', threads=1))"
            ".translate(['ein Mann']); print('torch.utils.cpp_extension' in sys.modules)")
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert imported.stdout.split() == ["False"], imported.stderr


def test_fairseqs_flag_names_work_as_in_fairseq(run_dir):
    """`--path a.pt:b.pt` (an ensemble) and `--gen-subset`, as a fairseq user types them."""
    ckpt = run_dir / "checkpoints" / "checkpoint_last.pt"
    ours = run_nmt("translate", "--threads", "1", "-r", run_dir, "-c", ckpt, "-c", ckpt, input="ein Mann\n")
    theirs = run_nmt("translate", "--threads", "1", "-r", run_dir, "--path", f"{ckpt}:{ckpt}", input="ein Mann\n")
    assert theirs.returncode == 0 and theirs.stdout == ours.stdout, theirs.stderr
    assert f"ensemble of {ckpt}, {ckpt}" in theirs.stderr
    subset = run_nmt("translate", "--threads", "1", "-r", run_dir, "--gen-subset", "nosuch")
    assert "has no split 'nosuch'" in subset.stderr


class _RecordingTokenizer:
    """Stands in for SentencePiece: records what it is asked to encode."""

    vocab_size = 20

    def __init__(self):
        self.encoded: list[str] = []

    def encode(self, lines):
        self.encoded += lines
        return [[5 + (len(w) % 10) for w in line.split()] for line in lines]

    def decode(self, ids):
        return ["Hallo , Welt !" for _ in ids]


def test_moses_runs_are_tokenized_before_and_detokenized_after(monkeypatch):
    pytest.importorskip("sacremoses")
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", 20, 20)).eval()
    tok = _RecordingTokenizer()
    translator = Translator([model], tok, tok, SearchConfig(max_len_b=3), TranslateConfig(), moses_langs=("en", "de"))
    out = translator.translate(["Hello, world!", ""])
    assert tok.encoded == ["Hello , world !", ""]
    assert [t.hyp for t in out] == ["Hallo, Welt!", ""]


def test_a_translation_never_spans_lines():
    class Multiline(_RecordingTokenizer):
        def decode(self, ids):
            return ["eins\nzwei\u2028drei" for _ in ids]

    torch.manual_seed(0)
    model = Transformer(build_config("tiny", 20, 20)).eval()
    tok = Multiline()
    out = Translator([model], tok, tok, SearchConfig(max_len_b=2), TranslateConfig()).translate(["a b", "c"])
    assert [t.hyp for t in out] == ["eins zwei drei"] * 2


def test_native_cpu_translation_keeps_freed_memory_for_reuse(run_dir):
    """`nmt translate` with nmt's engine on a CPU raises glibc's malloc thresholds, as CPU training
    does (each beam step frees what the next allocates again; see nmt.ops.cpu_malloc), once."""
    import subprocess
    import sys

    probe = ("import sys, nmt.ops.cpu_malloc as m; m.keep_freed_memory = lambda: print('malloc tuned', file=sys.stderr); "
             "from nmt_cli import main; sys.argv = ['nmt'] + sys.argv[1:]; main.main()")
    proc = subprocess.run([sys.executable, "-c", probe, "translate", "--run-dir", str(run_dir), "--device", "cpu", "--quiet"],
                          input="ein Mann fährt\nzwei Hunde\n".encode(), capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout.decode().splitlines()) == 2
    assert proc.stderr.decode().splitlines() == ["malloc tuned"]
