"""`nmt distill`: a teacher's translations of a corpus as a student's training pair; the
n-best selection, the line contract, resume after a kill, several processes, and a student
architecture through the whole chain (train, average, export, CTranslate2)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import assert_one_line_error, paused_in_time, run_nmt, start_nmt
from nmt.distill.selection import select

N_LINES = 300


@pytest.fixture(scope="module")
def corpus(multi30k_dir: Path, tmp_path_factory) -> tuple[Path, Path]:
    """300 Multi30k validation pairs (not the teacher's training lines), with an empty line and a
    line longer than the tiny teacher's 256 positions among them."""
    root = tmp_path_factory.mktemp("corpus")
    sides = {}
    for lang in ("en", "de"):
        with gzip.open(multi30k_dir / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
            sides[lang] = [line.rstrip("\n") for _, line in zip(range(N_LINES - 2), f)]
    sides["en"][10:10] = ["", " ".join(["a dog runs in the park"] * 80)]
    sides["de"][10:10] = ["leer", "zu lang"]
    for lang, lines in sides.items():
        (root / f"corpus.{lang}").write_text("".join(l + "\n" for l in lines), encoding="utf-8")
    return root / "corpus.en", root / "corpus.de"


def distill(teacher: Path, corpus: tuple[Path, Path], out: Path, *args: str) -> subprocess.CompletedProcess:
    return run_nmt("distill", "-r", teacher, "--source", corpus[0], "--reference", corpus[1], "-o", out,
                   "--threads", "1", "--quiet", *args)


def test_chrf_selection_picks_the_hypothesis_closest_to_the_reference_and_best_the_first():
    nbest = [("Ein Hund rennt.", -0.1), ("Ein Hund läuft im Park.", -0.4), ("Hund Park", -0.9)]
    reference = "Ein Hund läuft im Park."
    assert select(nbest, reference, "chrf") == "Ein Hund läuft im Park."
    assert select(nbest, reference, "best") == "Ein Hund rennt."
    assert select(nbest, None, "chrf") == "Ein Hund rennt."  # no reference: the model's choice
    assert select([("a", -1.0), ("a", -2.0)], "b", "chrf") == "a"  # a tie keeps the higher model score
    assert select([], "b", "chrf") == ""


@pytest.fixture(scope="module")
def distilled(trained_tiny_run, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("distilled") / "out"
    proc = distill(trained_tiny_run, corpus, out, "--chunk-lines", "64")
    assert proc.returncode == 0, proc.stderr
    return out


def test_every_line_in_gets_its_line_out_and_the_dropped_ones_are_counted(distilled, corpus):
    source = corpus[0].read_text(encoding="utf-8").splitlines()
    assert (distilled / "train.en").read_text(encoding="utf-8").splitlines() == source
    target = (distilled / "train.de").read_text(encoding="utf-8").split("\n")
    assert target[-1] == "" and len(target) - 1 == N_LINES
    assert target[10] == "" and target[11] == ""  # the empty and the over-long line keep their places, empty
    summary = json.loads((distilled / "summary.json").read_text())
    assert summary["lines"] == N_LINES and summary["empty"] == 1 and summary["too_long"] == 1
    assert summary["kept"] + summary["no_hypothesis"] == N_LINES - 2
    assert summary["kept"] == sum(1 for t in target[:-1] if t)
    assert summary["select"] == "chrf" and summary["chunks"] == 5


def test_best_is_what_translate_prints(trained_tiny_run, corpus, tmp_path):
    out = tmp_path / "best"
    assert distill(trained_tiny_run, corpus, out, "--select", "best").returncode == 0
    lines = corpus[0].read_text(encoding="utf-8").splitlines()
    kept = [i for i, l in enumerate(lines) if l and i != 11]
    plain = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--quiet",
                    input="".join(lines[i] + "\n" for i in kept))
    assert plain.returncode == 0, plain.stderr
    target = (out / "train.de").read_text(encoding="utf-8").splitlines()
    assert [target[i] for i in kept] == plain.stdout.splitlines()


def test_chrf_differs_from_best_only_by_choosing_within_the_beam(trained_tiny_run, corpus, distilled, tmp_path):
    best = tmp_path / "best"
    assert distill(trained_tiny_run, corpus, best, "--select", "best").returncode == 0
    a = (distilled / "train.de").read_text(encoding="utf-8").splitlines()
    b = (best / "train.de").read_text(encoding="utf-8").splitlines()
    assert len(a) == len(b) and a != b  # chrF took another of the 4 hypotheses on some lines


def test_a_distillation_killed_mid_corpus_resumes_to_identical_output_without_redoing_chunks(
        trained_tiny_run, corpus, distilled, tmp_path):
    out = tmp_path / "killed"
    args = ["distill", "-r", trained_tiny_run, "--source", corpus[0], "--reference", corpus[1], "-o", out,
            "--threads", "1", "--quiet", "--chunk-lines", "64"]
    for attempt in range(5):  # paused after its first chunk, killed while chunks are left
        proc = start_nmt(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = lambda: sorted((out / "chunks").glob("*.json")) if (out / "chunks").is_dir() else []  # noqa: E731
        if paused_in_time(proc.pid, lambda: bool(done()) or proc.poll() is not None,
                          lambda: proc.poll() is None and len(done()) < 5):
            break
        proc.wait()
        for f in out.rglob("*"):
            if f.is_file():
                f.unlink()
    else:
        pytest.fail("five distillations finished before this test could pause them")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = {f.name: f.stat().st_mtime_ns for f in done()}
    assert 1 <= len(finished) < 5 and not (out / "train.de").exists()

    again = run_nmt(*args)
    assert again.returncode == 0, again.stderr
    assert {f.name: f.stat().st_mtime_ns for f in done() if f.name in finished} == finished  # not redone
    for name in ("train.en", "train.de", "summary.json"):
        assert (out / name).read_bytes() == (distilled / name).read_bytes().replace(str(distilled).encode(), str(out).encode())


def test_a_finished_distillation_moved_elsewhere_names_where_its_files_are_now(trained_tiny_run, corpus, distilled, tmp_path):
    moved = shutil.copytree(distilled, tmp_path / "moved")
    proc = run_nmt("distill", "-r", trained_tiny_run, "--source", corpus[0], "--reference", corpus[1], "-o", moved,
                   "--threads", "1", "--chunk-lines", "64")
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "5 of 5 chunks already done" in said and f"-> {moved / 'train.en'}, {moved / 'train.de'}" in said
    assert str(distilled) not in said


def test_two_processes_give_the_output_of_one(trained_tiny_run, corpus, distilled, tmp_path):
    out = tmp_path / "two"
    proc = distill(trained_tiny_run, corpus, out, "--chunk-lines", "64", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert (out / "train.de").read_bytes() == (distilled / "train.de").read_bytes()


def test_back_translation_samples_a_monolingual_source_reproducibly(trained_tiny_run, corpus, tmp_path):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        proc = run_nmt("distill", "-r", trained_tiny_run, "--source", corpus[0], "-o", out, "--sampling",
                       "--sampling-topk", "10", "--seed", "3", "--chunk-lines", "100", "--threads", "1", "--quiet")
        assert proc.returncode == 0, proc.stderr
        runs.append((out / "train.de").read_text(encoding="utf-8"))
    assert runs[0] == runs[1] and len(runs[0].split("\n")) == N_LINES + 1
    assert json.loads((tmp_path / "a/summary.json").read_text())["select"] == "best"


def test_user_errors_are_one_line(trained_tiny_run, corpus, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("ein Hund\n", encoding="utf-8")
    assert_one_line_error(distill(trained_tiny_run, (corpus[0], short), tmp_path / "o1"), "300 lines", "1")
    assert_one_line_error(distill(trained_tiny_run, (tmp_path / "missing.en", corpus[1]), tmp_path / "o2"),
                          "--source", "no such file")
    out = tmp_path / "o3"
    assert distill(trained_tiny_run, corpus, out, "--select", "best").returncode == 0
    assert_one_line_error(distill(trained_tiny_run, corpus, out, "--select", "best", "--beam", "2"),
                          str(out), "search", "new -o")
    assert_one_line_error(distill(trained_tiny_run, corpus, tmp_path / "o4", "--nbest", "1"), "--nbest 2")
    assert_one_line_error(distill(trained_tiny_run, corpus, tmp_path / "o5", "--select", "bleu"), "--select")


@pytest.mark.slow
def test_a_student_architecture_trains_on_distilled_data_averages_exports_and_translates_alike_in_ctranslate2(
        trained_tiny_run, distilled, tmp_path):
    pytest.importorskip("ctranslate2")
    student = tmp_path / "student"
    steps = [("preprocess", "-r", student, "-s", "en", "-t", "de", "--trainpref", distilled / "train",
              "--validpref", trained_tiny_run.parent / "val", "--vocab-size", "1000", "--workers", "1"),
             ("train", "-r", student, "--arch", "student-mini", "--amp", "none", "--max-tokens", "1024", "--threads", "1",
              "--no-progress-bar", "--seed", "1", "--save-interval-minutes", "0", "--save-interval-updates", "40",
              "--warmup", "40", "--lr", "3e-3", "--max-update", "80"),
             ("average-checkpoints", "-r", student, "--last", "2"),
             ("export", "-r", student, "-o", tmp_path / "ct2")]
    for step in steps:
        proc = run_nmt(*step)
        assert proc.returncode == 0, proc.stderr
    record = json.loads((student / "config/train.json").read_text())
    assert record["train_config"]["model"]["arch"] == "student-mini"
    lines = (trained_tiny_run.parent / "val.en").read_text(encoding="utf-8")
    style = ["--beam-style", "fairseq", "--lenpen-style", "avg", "--beam", "1", "--threads", "1"]
    native = run_nmt("translate", "-r", student, *style, input=lines)
    ct2 = run_nmt("translate", "-r", student, *style, "--engine", "ctranslate2", "--ct2-model", tmp_path / "ct2",
                  input=lines)
    assert native.returncode == 0 and ct2.returncode == 0, native.stderr + ct2.stderr
    assert "checkpoint_avg.pt" in native.stderr
    a, b = native.stdout.splitlines(), ct2.stdout.splitlines()
    assert len(a) == len(b) == 100 and sum(len(set(x.split())) > 2 for x in a) >= 90  # it writes sentences
    assert sum(x == y for x, y in zip(a, b)) >= 99, [(x, y) for x, y in zip(a, b) if x != y]
