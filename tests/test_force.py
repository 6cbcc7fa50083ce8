"""Replacing an output deletes only what nmt wrote (`nmt.run.replace`): `export --force`,
`preprocess --force` and `average-checkpoints -o` refuse anything else in one line, and
delete nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.run.identity import run_identity
from nmt.run.directory import RunDir
from test_identity import make_run, save_model

WORDS = "ein Mann fährt Fahrrad über die Straße zwei Hunde spielen im Schnee"


def listing(root: Path) -> list[tuple[str, int]]:
    """Every path under `root` with its size (0 for folders): what a deletion would change."""
    return [(str(p.relative_to(root)), p.stat().st_size if p.is_file() else 0) for p in sorted(root.rglob("*"))]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """TMP/runs/run: a run directory with a checkpoint, beside a file of the user's."""
    run = make_run(tmp_path / "runs" / "run", WORDS, 0)
    save_model(run / "checkpoints" / "checkpoint_last.pt", 0, run_identity(RunDir(run)))
    (tmp_path / "runs" / "notes.txt").write_text("mine")
    return run


def _unrelated(run: Path) -> Path:
    folder = run.parent / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"not nmt's")
    return folder


@pytest.mark.parametrize("target, reason", [
    (lambda run: run, "is a run directory"),
    (lambda run: run / "checkpoints", "is the checkpoints folder of run directory"),
    (lambda run: f"{run}/..", "holds run directory"),
    (_unrelated, "is not an earlier export"),
], ids=["run", "checkpoints", "parent", "unrelated"])
def test_export_force_refuses_what_nmt_did_not_write(run: Path, tmp_path: Path, target, reason):
    output = target(run)
    before = listing(tmp_path)
    proc = run_nmt("export", "-r", run, "-o", output, "--force")
    assert_one_line_error(proc, "refusing to replace", reason, "nothing was deleted")
    assert listing(tmp_path) == before


def test_export_force_replaces_an_earlier_export_and_nothing_else(run: Path, tmp_path: Path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "model.ct2"
    assert run_nmt("export", "-r", run, "-o", out).returncode == 0
    (out / "model.bin").write_bytes(b"stale")
    proc = run_nmt("export", "-r", run, "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.bin").read_bytes() != b"stale"
    assert json.loads((out / "nmt_export.json").read_text())["source_lang"] == "en"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left

    (out / "my_notes.txt").write_text("mine")  # an export with a file of the user's is no longer only nmt's
    before = listing(tmp_path)
    assert_one_line_error(run_nmt("export", "-r", run, "-o", out, "--force"), "is not an earlier export")
    assert listing(tmp_path) == before


def test_preprocess_force_keeps_a_data_folder_it_did_not_write(tmp_path: Path):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    for lang, words in (("en", "a man rides a bike"), ("de", "ein Mann fährt Fahrrad")):
        (project / "data" / f"train.{lang}").write_text("\n".join([words] * 50) + "\n")
    before = listing(tmp_path)
    proc = run_nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", project / "data" / "train", "--vocab-size", "30",
                   "--workers", "1", "-r", project, "--force")
    assert_one_line_error(proc, f"refusing to replace {project / 'data'}", ".bin and .idx", "nothing was deleted")
    assert listing(tmp_path) == before


def test_average_output_replaces_only_an_earlier_average(run: Path, tmp_path: Path):
    ck = run / "checkpoints"
    save_model(tmp_path / "x.pt", 1, run_identity(RunDir(run)))
    inputs = ["--inputs", ck / "checkpoint_last.pt", tmp_path / "x.pt"]
    notes, copy = tmp_path / "runs" / "notes.txt", tmp_path / "best_copy.pt"
    shutil.copyfile(ck / "checkpoint_last.pt", copy)  # an nmt checkpoint, but not an average
    for target in (notes, copy):
        before = target.read_bytes()
        proc = run_nmt("average-checkpoints", "-r", run, *inputs, "-o", target)
        assert_one_line_error(proc, f"refusing to replace {target}", "is not an earlier average")
        assert target.read_bytes() == before
    for _ in range(2):  # the second average replaces the first
        proc = run_nmt("average-checkpoints", "-r", run, *inputs, "-o", tmp_path / "avg.pt")
        assert proc.returncode == 0, proc.stderr
