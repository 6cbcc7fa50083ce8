"""`nmt export --format ctranslate2` and `nmt translate --engine ctranslate2`: the exported
model is nmt's model, and CTranslate2's search is nmt's `--beam-style fairseq --lenpen-style avg`."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import assert_one_line_error, finish, run_nmt, start_nmt, torch_blocked_env
from nmt.run.identity import run_identity
from nmt.run.directory import RunDir
from test_identity import save_model, two_runs  # noqa: F401  (two_runs: a fixture)

ctranslate2 = pytest.importorskip("ctranslate2")

N_LINES = 200


@pytest.fixture(scope="module")
def exported(trained_tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("ct2") / "model"
    proc = run_nmt("export", "-r", trained_tiny_run, "--format", "ctranslate2", "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def test_lines(multi30k_dir) -> list[str]:
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(N_LINES), f)]


def _pieces_and_translator(exported):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(exported / "joint.model")), ctranslate2.Translator(str(exported), intra_threads=1)


def test_export_writes_vocabulary_tokenizer_and_nmts_special_tokens(exported, trained_tiny_run):
    config = json.loads((exported / "config.json").read_text())
    assert config["decoder_start_token"] == "<s>" and config["add_source_eos"] is True and config["add_source_bos"] is False
    assert config["eos_token"] == "</s>"
    vocab = json.loads((exported / "shared_vocabulary.json").read_text())
    assert vocab[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (exported / "joint.model").read_bytes() == (trained_tiny_run / "vocab" / "joint.model").read_bytes()
    record = json.loads((exported / "nmt_export.json").read_text())
    assert record["source_lang"] == "en" and record["tokenizer"] == {"en": "joint.model", "de": "joint.model"}

    again = run_nmt("export", "-r", trained_tiny_run, "-o", exported)
    assert_one_line_error(again, "already exists", "--force")
    assert (exported / "model.bin").is_file()


def test_ctranslate2_scores_nmts_translations_as_nmt_does(exported, trained_tiny_run, test_lines):
    """Same weights, positions, scaling and special tokens: CTranslate2's log-probability of
    nmt's own outputs equals nmt's."""
    import torch

    from nmt.inference.beam_search import SearchConfig, beam_search
    from nmt.export.ctranslate2 import vocabulary_tokens
    from nmt.data.tokenizer import EOS_ID, PAD_ID
    from nmt.inference.translator import TranslateConfig, load_translator

    nmt = load_translator(trained_tiny_run, cfg=TranslateConfig(device="cpu", threads=1))
    ids = nmt.src_tokenizer.encode(test_lines[:40])
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD_ID, dtype=torch.long)
    for i, seq in enumerate(ids):
        src[i, : len(seq) + 1] = torch.tensor([*seq, EOS_ID])
    hyps = [found[0] for found in beam_search(nmt.models, src, SearchConfig())]
    pieces = vocabulary_tokens(nmt.src_tokenizer)
    _, translator = _pieces_and_translator(exported)
    scored = translator.score_batch([[pieces[t] for t in seq] for seq in ids], [[pieces[t] for t in h.tokens] for h in hyps])
    assert [sum(s.log_probs) for s in scored] == pytest.approx([h.log_prob for h in hyps], abs=1e-4)  # eos included


def test_ctranslate2_beam_search_agrees_with_the_fairseq_style(exported, trained_tiny_run, test_lines):
    """CTranslate2 as a user runs it (beam 4, length_penalty 0.6, patience 1, end token
    counted) against `nmt translate --beam-style fairseq --lenpen-style avg`: the lines that
    differ are lines where a hypothesis reached nmt's length limit (eos forced there in nmt,
    not in CTranslate2)."""
    proc = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--beam-style", "fairseq", "--lenpen-style", "avg",
                   "--quiet", input="\n".join(test_lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    ours = proc.stdout.splitlines()
    sp, translator = _pieces_and_translator(exported)
    src = [sp.encode(line, out_type=str) for line in test_lines]
    results = translator.translate_batch(src, beam_size=4, length_penalty=0.6, patience=1, return_end_token=True,
                                         min_decoding_length=0, max_decoding_length=max(map(len, src)) + 51)
    theirs = [sp.decode([p for p in r.hypotheses[0] if p != "</s>"]) for r in results]
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert len(differ) <= N_LINES // 100, differ
    for i in differ:
        limit = len(src[i]) + 50
        assert max(len(sp.encode(ours[i])), len(results[i].hypotheses[0])) >= limit - 2, (ours[i], theirs[i])


def test_engine_keeps_the_line_contract(trained_tiny_run, test_lines):
    lines = [test_lines[0], "", "   ", test_lines[1]]
    data = ("\n".join(lines) + "\n").encode() + b"zwei \xff Hunde"
    args = ["translate", "-r", trained_tiny_run, "--threads", "1", "--beam-style", "fairseq", "--lenpen-style", "avg", "--quiet"]
    ct2 = run_nmt(*args, "--engine", "ctranslate2", "--encoding-errors", "replace", "--format", "jsonl", "--nbest", "2", input=data)
    nmt = run_nmt(*args, "--encoding-errors", "replace", "--format", "jsonl", "--nbest", "2", input=data)
    assert ct2.returncode == 0 and nmt.returncode == 0, ct2.stderr + nmt.stderr
    rows, want = [json.loads(l) for l in ct2.stdout.splitlines()], [json.loads(l) for l in nmt.stdout.splitlines()]
    assert len(rows) == 5
    assert rows[1] == rows[2] == {"hyp": "", "score": None, "nbest": []}
    for row, w in zip(rows, want):
        assert row["hyp"] == w["hyp"] and [h["hyp"] for h in row["nbest"]] == [h["hyp"] for h in w["nbest"]]
        assert [h["score"] for h in row["nbest"]] == pytest.approx([h["score"] for h in w["nbest"]], rel=1e-3)  # CTranslate2 search math is not bit-equal
    assert_one_line_error(run_nmt(*args, "--engine", "ctranslate2", input=data), "line 5", "--encoding-errors replace")


def test_engine_on_an_export_never_imports_torch_and_keeps_every_line(trained_tiny_run, test_lines, tmp_path):
    """With RUN/ctranslate2 current, translate runs where `import torch` fails: same output
    as with torch importable, one line out per line in on the adversarial input, jsonl n-best."""
    lines = [test_lines[0], "", "   ", "\u2028", test_lines[1], "x" * 3000, test_lines[2]]
    data = ("\n".join(lines) + "\n").encode() + b"zwei \xff Hunde\n\n"
    args = ["translate", "-r", trained_tiny_run, "--threads", "1", "--engine", "ctranslate2", *CT2_SEARCH,
            "--encoding-errors", "replace", "--format", "jsonl", "--nbest", "2"]
    with_torch = run_nmt(*args, input=data)  # exports RUN/ctranslate2/CHECKPOINT when it is not current
    without = run_nmt(*args, input=data, env=torch_blocked_env(tmp_path))
    assert with_torch.returncode == 0 and without.returncode == 0, with_torch.stderr + without.stderr
    assert without.stdout == with_torch.stdout
    rows = [json.loads(l) for l in without.stdout.splitlines()]
    assert len(rows) == len(lines) + 2 and rows[1] == rows[2] == rows[-1] == {"hyp": "", "score": None, "nbest": []}
    assert all(len(r["nbest"]) == 2 for i, r in enumerate(rows) if i not in (1, 2, 3, len(rows) - 1))
    assert "1 line(s) longer than" in without.stderr  # the 3000 x's were truncated and counted
    refused = run_nmt("translate", "-r", trained_tiny_run, "--engine", "ctranslate2", *CT2_SEARCH,
                      input=b"ok\nzwei \xff Hunde\n", env=torch_blocked_env(tmp_path))
    assert_one_line_error(refused, "line 2", "--encoding-errors replace")


def test_one_call_for_all_lengths_matches_one_call_per_length(trained_tiny_run, test_lines):
    """Every line gets the search of its own length limit, as if translated alone: the same
    as calls grouped by source length, on limits tight enough that many lines reach them."""
    from nmt.inference.config import SearchConfig, TranslateConfig
    from nmt.inference.translator import load_translator

    for max_len_b in (0, 3, 50):
        search = SearchConfig(beam_style="fairseq", lenpen_style="avg", max_len_a=0.8, max_len_b=max_len_b, nbest=2)
        translator = load_translator(trained_tiny_run, search=search,
                                     cfg=TranslateConfig(engine="ctranslate2", threads=1, device="cpu"))
        ids = translator.src_tokenizer.encode(test_lines[:120])
        together = translator.decoder.decode(ids, search)
        by_length: dict[int, list[int]] = {}
        for i, seq in enumerate(ids):
            by_length.setdefault(len(seq), []).append(i)
        for group in by_length.values():
            alone = translator.decoder.decode([ids[i] for i in group], search)
            for i, found in zip(group, alone):
                assert [h.tokens for h in together[i]] == [h.tokens for h in found], (max_len_b, test_lines[i])
                limit = search.max_output_length(len(ids[i]), translator.decoder.max_positions)
                assert all(len(h.tokens) <= limit for h in found)  # tokens before eos, as nmt counts the limit


def test_at_the_length_limit_the_engine_translates_as_nmt_does(trained_tiny_run, test_lines):
    """--max-len-a 0 --max-len-b B: nmt allows B tokens and forces eos after them, where
    CTranslate2's max_decoding_length counts eos and ends its last step with any token; the
    engine gives what nmt gives, translations and scores, on limits most lines reach."""
    from nmt.inference.config import SearchConfig, TranslateConfig
    from nmt.inference.translator import load_translator

    lines = test_lines[:100]
    for max_len_b in (0, 2, 3):
        search = SearchConfig(beam_style="fairseq", lenpen_style="avg", max_len_a=0, max_len_b=max_len_b)
        nmt, engine = (load_translator(trained_tiny_run, search=search, cfg=TranslateConfig(engine=name, threads=1, device="cpu"))
                       for name in ("nmt", "ctranslate2"))
        native, ct2 = nmt.translate(lines), engine.translate(lines)
        reached = sum(len(tokens) == max_len_b for tokens in nmt.tgt_tokenizer.encode([t.hyp for t in native]))
        assert reached > len(lines) // 2, max_len_b  # the limit decides most lines
        assert [t.hyp for t in ct2] == [t.hyp for t in native], max_len_b
        assert [t.score for t in ct2] == pytest.approx([t.score for t in native], rel=1e-4)


def test_cpu_batches_default_to_1024_tokens_and_batch_sizes_agree_on_almost_every_line(trained_tiny_run, test_lines):
    """--max-tokens 0 (auto) gives CTranslate2 on a CPU 1024-token batches (its peak memory:
    `CTRANSLATE2_CPU_BATCH_TOKENS`), nmt's own engine 4096, a given --max-tokens wins for both,
    and whatever the batches, every line comes back in its place with almost always the same
    translation."""
    from nmt.inference.config import CTRANSLATE2_CPU_BATCH_TOKENS, DEFAULT_BATCH_TOKENS, SearchConfig, TranslateConfig
    from nmt.inference.translator import load_translator

    search = SearchConfig(beam_style="fairseq", lenpen_style="avg")
    outputs = {}
    for max_tokens in (0, 64, 4096):
        cfg = TranslateConfig(engine="ctranslate2", threads=1, device="cpu", max_tokens=max_tokens)
        translator = load_translator(trained_tiny_run, search=search, cfg=cfg)
        assert translator.decoder.max_tokens == (max_tokens or CTRANSLATE2_CPU_BATCH_TOKENS)
        outputs[max_tokens] = [t.hyp for t in translator.translate(test_lines)]
    # CTranslate2's CPU kernels round differently with another batch's padding (seen on AVX2), which can flip a near-tie.
    for max_tokens in (64, 4096):
        assert len(outputs[max_tokens]) == len(test_lines)
        same = sum(a == b for a, b in zip(outputs[0], outputs[max_tokens]))
        assert same >= 0.95 * len(test_lines), (max_tokens, same)
    for max_tokens in (0, 64):
        native = load_translator(trained_tiny_run, search=search, cfg=TranslateConfig(threads=1, device="cpu", max_tokens=max_tokens))
        assert native.decoder.max_tokens == (max_tokens or DEFAULT_BATCH_TOKENS)


def test_engine_takes_its_own_search_when_none_is_given_and_refuses_another_given(trained_tiny_run):
    """A CTranslate2 user types --engine ctranslate2 alone: its search (fairseq's rule, |Y|^alpha)
    is taken and said once; a style the engine lacks, typed on the command line, is refused."""
    lines = "a man\ntwo dogs play in the snow\n"
    plain = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--engine", "ctranslate2", input=lines)
    assert plain.returncode == 0, plain.stderr
    assert plain.stderr.count("searches by its own rule: --beam-style fairseq --lenpen-style avg") == 1
    explicit = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--engine", "ctranslate2",
                       "--beam-style", "fairseq", "--lenpen-style", "avg", input=lines)
    assert explicit.stdout == plain.stdout and "its own rule" not in explicit.stderr
    proc = run_nmt("translate", "-r", trained_tiny_run, "--engine", "ctranslate2", "--lenpen-style", "gnmt", input=lines)
    assert_one_line_error(proc, "--lenpen-style avg")


# -- vocabulary identity, damaged records, concurrent exports, the help's command ------------
# On two small runs (test_identity's: one vocabulary size, other pieces; random `tiny` models),
# which export and translate in seconds.

CT2_SEARCH = ("--beam-style", "fairseq", "--lenpen-style", "avg")


@pytest.fixture(scope="module")
def small_exports(two_runs, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("small_ct2")
    exports = {}
    for name, run in zip("ab", two_runs):
        proc = run_nmt("export", "-r", run, "-o", out / name)
        assert proc.returncode == 0, proc.stderr
        exports[name] = out / name
    return exports


def ct2_translate(run: Path, *args: str, input: str = "ein Mann\n"):
    return run_nmt("translate", "-r", run, "--threads", "1", "--engine", "ctranslate2", *CT2_SEARCH, *args, input=input)


def test_export_records_the_vocabulary_identity(two_runs, small_exports):
    record = json.loads((small_exports["a"] / "nmt_export.json").read_text())
    assert record["identity"] == run_identity(RunDir(two_runs[0]))


def test_export_refuses_another_runs_checkpoint_of_the_same_size(two_runs, tmp_path):
    a, b = two_runs
    proc = run_nmt("export", "-r", a, "-c", b / "checkpoints" / "checkpoint_last.pt", "-o", tmp_path / "x")
    assert_one_line_error(proc, "another vocabulary", "sha256")
    assert list(tmp_path.iterdir()) == []


def test_translate_refuses_a_model_exported_from_another_vocabulary(two_runs, small_exports):
    proc = ct2_translate(two_runs[0], "--ct2-model", small_exports["b"])
    assert_one_line_error(proc, str(small_exports["b"]), "another vocabulary", "sha256", "nmt export")
    assert proc.stdout == ""


@pytest.mark.parametrize("damage", ["missing", "not json", "no identity", "no max_positions"])
def test_a_missing_or_damaged_export_record_is_one_line(two_runs, small_exports, tmp_path, damage):
    model = tmp_path / "model"
    shutil.copytree(small_exports["a"], model)
    record_file = model / "nmt_export.json"
    record = json.loads(record_file.read_text())
    if damage == "missing":
        record_file.unlink()
    elif damage == "not json":
        record_file.write_text('{"format": "ctranslate2", ')
    else:
        del record[damage.removeprefix("no ")]
        record_file.write_text(json.dumps(record))
    proc = ct2_translate(two_runs[0], "--ct2-model", model)
    assert_one_line_error(proc, str(model), "nmt export")


def test_translates_started_at_once_all_succeed(two_runs, tmp_path):
    """Four `nmt translate --engine ctranslate2` forked within milliseconds of each other (no
    interpreter start or import to stagger them): each finds no export in RUN/ctranslate2/ and
    would export it: one does, the others wait for it and use it, rather than replacing the
    directory another is loading."""
    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run)
    procs = [start_nmt("translate", "-r", run, "--engine", "ctranslate2", "--beam-style", "fairseq", "--lenpen-style",
                       "avg", "--threads", "1", "--device", "cpu", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True) for _ in range(4)]
    done = [finish(proc, "ein Mann\n", timeout=600) for proc in procs]
    assert all(d.returncode == 0 for d in done), [d.stderr for d in done]
    assert len({d.stdout for d in done}) == 1 and done[0].stdout.count("\n") == 1
    assert [p.name for p in (run / "ctranslate2").iterdir() if p.is_dir()] == ["checkpoint_last"]  # no staging left


def test_the_decode_commands_in_export_help_work_as_written(two_runs, tmp_path):
    """`nmt translate ...` and the Python call in `nmt export --help`, run as they are printed
    (a model of 256 positions: the Python call decodes up to |X| + 50 tokens)."""
    run, model = two_runs[0], tmp_path / "model"
    save_model(tmp_path / "wide.pt", 0, run_identity(RunDir(run)), max_positions=256)
    assert run_nmt("export", "-r", run, "-c", tmp_path / "wide.pt", "-o", model).returncode == 0
    help_text = run_nmt("export", "--help", env={"COLUMNS": "1000"}).stdout
    command = re.search(r"`(nmt translate [^`]*)`", help_text).group(1)
    args = shlex.split(command.replace("RUN", str(run)).replace("DIR", str(model)))
    proc = run_nmt(*args[1:], "--threads", "1", input="ein Mann\n")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1

    import sentencepiece as spm

    snippet = re.search(r"`(ctranslate2\.Translator\(DIR\)[^`]*)`", help_text).group(1)
    pieces = spm.SentencePieceProcessor(model_file=str(model / "joint.model")).encode("ein Mann", out_type=str)
    results = eval(snippet, {"ctranslate2": ctranslate2, "DIR": str(model), "pieces": pieces})
    assert len(results) == 1 and results[0].hypotheses


def test_export_builds_no_kernels_and_says_nothing_but_its_own_lines(two_runs, tmp_path):
    """Export reads weights and never decodes: it loads the stock model, so a fresh machine does
    not compile the C++ decoder kernels (about 30 s) for it, and stderr holds only nmt's lines."""
    extensions = tmp_path / "extensions"
    extensions.mkdir()
    proc = run_nmt("export", "-r", two_runs[0], "-o", tmp_path / "model", env={"TORCH_EXTENSIONS_DIR": str(extensions)})
    assert proc.returncode == 0, proc.stderr
    assert list(extensions.iterdir()) == [] and "C++ decoder kernels" not in proc.stderr
    assert all(line.startswith("nmt") for line in proc.stderr.splitlines()), proc.stderr


def test_an_export_aligns_with_the_layer_nmt_translate_aligns_with_by_default():
    """Export never imports nmt.inference, so it names the layer itself; an engine asked for
    another layer than the export's refuses, so the two must agree."""
    from nmt.export.ctranslate2 import alignment_layer
    from nmt.inference.config import AlignmentConfig

    assert [alignment_layer(n) for n in (1, 2, 6)] == [AlignmentConfig().layer_of(n) for n in (1, 2, 6)]


# -- --force replaces an earlier export, never a file a hand-made record names ----------------


def test_force_never_deletes_a_file_a_hand_made_export_record_names(two_runs, tmp_path):
    """What --force may delete is known to export itself (`export_file_names`): a record in
    the folder is no list of what may go, for anyone can write one."""
    from nmt.errors import NmtError
    from nmt.export.ctranslate2 import export_ctranslate2

    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    (folder / "model.bin").write_bytes(b"")
    (folder / "nmt_export.json").write_text(json.dumps({"format": "ctranslate2", "source_lang": "en", "target_lang": "de",
                                                        "tokenizer": {"en": "thesis.tex", "de": "thesis.tex"}}))
    with pytest.raises(NmtError, match="refusing to replace .*thesis: it is not an earlier export"):
        export_ctranslate2(two_runs[0], folder, force=True)
    assert (folder / "thesis.tex").read_text() == "years of work"
    proc = run_nmt("export", "-r", two_runs[0], "-o", folder, "--force")
    assert_one_line_error(proc, "refusing to replace", "nothing was deleted")
    assert sorted(p.name for p in folder.iterdir()) == ["model.bin", "nmt_export.json", "thesis.tex"]


def test_force_replaces_an_earlier_export_of_either_tokenizer_layout(small_exports, two_runs, tmp_path):
    from nmt.export.ctranslate2 import export_ctranslate2, is_export

    marian = tmp_path / "marian"  # an imported run's export: one SentencePiece model per side
    marian.mkdir()
    for name in ("model.bin", "config.json", "shared_vocabulary.json", "en_source.spm", "de_target.spm"):
        (marian / name).write_bytes(b"")
    (marian / "nmt_export.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    assert is_export(marian)
    (marian / "notes.txt").write_text("mine")
    assert not is_export(marian)
    again = tmp_path / "again"
    shutil.copytree(small_exports["a"], again)
    assert export_ctranslate2(two_runs[0], again, force=True) == again
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in small_exports["a"].iterdir())
