"""`nmt average-checkpoints`: the element-wise mean of the right checkpoints, or a clear refusal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, run_nmt
from nmt.average import average_checkpoints, last_checkpoint_infos, list_checkpoints
from nmt.run.checkpoint import load_checkpoint, save_checkpoint
from nmt.errors import NmtError
from nmt.model.transformer import Transformer
from nmt.model.config import build_config


def make_checkpoint(path: Path, seed: int, epoch: int, update: int | None, arch: str = "tiny", vocab: int = 16,
                    **overrides) -> dict:
    """A training-shaped checkpoint of a randomly initialised model."""
    torch.manual_seed(seed)
    cfg = build_config(arch, vocab, vocab, **overrides)
    model = Transformer(cfg)
    train_state = {"epoch": epoch}
    if update is not None:
        train_state["update"] = update
    ckpt = {
        "version": 1,
        "model": model.state_dict(),
        "config": cfg.to_dict(),
        "optimizer": {"state": {}, "param_groups": []},
        "train_state": train_state,
    }
    save_checkpoint(path, ckpt)
    return ckpt


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory whose checkpoint names do not sort in update order as strings.

    Updates: checkpoint_1_100 (100), checkpoint_1_900 (900), checkpoint1 (end of epoch 1,
    update 1000, saved with train_state epoch 2 as training does), checkpoint_1_1000 (the same
    update again), checkpoint_2_1500 (1500), checkpoint2 (2000), plus best/last/avg, which are
    never candidates.
    """
    ck = tmp_path / "checkpoints"
    make_checkpoint(ck / "checkpoint_1_100.pt", 1, 1, 100)
    make_checkpoint(ck / "checkpoint_1_900.pt", 2, 1, 900)
    make_checkpoint(ck / "checkpoint1.pt", 3, 2, 1000)
    make_checkpoint(ck / "checkpoint_1_1000.pt", 3, 1, 1000)
    make_checkpoint(ck / "checkpoint_2_1500.pt", 4, 2, 1500)
    make_checkpoint(ck / "checkpoint2.pt", 5, 3, 2000)
    make_checkpoint(ck / "checkpoint_best.pt", 6, 3, 2000)
    make_checkpoint(ck / "checkpoint_last.pt", 7, 3, 2000)
    avg = make_checkpoint(ck / "checkpoint_avg.pt", 8, 3, 2000)
    save_checkpoint(ck / "checkpoint_avg.pt", {**avg, "averaged_from": ["checkpoint2.pt"]})  # averaging wrote it
    return tmp_path


def names(paths) -> list[str]:
    return [Path(p).name for p in paths]


def last_names(folder: Path, n: int, kind: str = "all") -> list[str]:
    return names(c.path for c in last_checkpoint_infos(folder, n, kind))


def test_candidates_are_ordered_by_stored_update_and_same_update_counts_once(run: Path):
    infos = list_checkpoints(run / "checkpoints")
    assert [c.update for c in infos] == [100, 900, 1000, 1500, 2000]
    assert names(c.path for c in infos)[2] in {"checkpoint1.pt", "checkpoint_1_1000.pt"}
    assert not {"checkpoint_best.pt", "checkpoint_last.pt", "checkpoint_avg.pt"} & set(names(c.path for c in infos))


def test_kind_selects_the_update_or_the_epoch_checkpoints(run: Path):
    assert last_names(run / "checkpoints", 3, "updates") == [
        "checkpoint_1_900.pt", "checkpoint_1_1000.pt", "checkpoint_2_1500.pt"]
    assert last_names(run / "checkpoints", 2, "epochs") == ["checkpoint1.pt", "checkpoint2.pt"]


def test_names_give_the_order_when_no_update_is_stored(tmp_path: Path):
    ck = tmp_path / "checkpoints"
    make_checkpoint(ck / "checkpoint10.pt", 1, 10, None)
    make_checkpoint(ck / "checkpoint9.pt", 2, 9, None)
    make_checkpoint(ck / "checkpoint_10_5000.pt", 3, 10, None)
    assert last_names(ck, 3) == ["checkpoint9.pt", "checkpoint_10_5000.pt", "checkpoint10.pt"]


def test_last_3_is_the_elementwise_mean_of_the_last_three_checkpoints(run: Path):
    proc = run_nmt("average-checkpoints", "-r", run, "--last", "3")
    assert proc.returncode == 0, proc.stderr
    for name in ("checkpoint_2_1500.pt", "checkpoint2.pt"):
        assert name in proc.stderr
    sources = [load_checkpoint(run / "checkpoints" / n) for n in
               last_names(run / "checkpoints", 3)]
    avg = load_checkpoint(run / "checkpoints" / "checkpoint_avg.pt")
    assert avg["config"] == sources[0]["config"]
    assert avg["averaged_from"] == last_names(run / "checkpoints", 3)
    assert "optimizer" not in avg and "train_state" not in avg
    assert set(avg["model"]) == set(sources[0]["model"])
    for name, tensor in avg["model"].items():
        expected = torch.stack([s["model"][name] for s in sources]).mean(dim=0)
        assert tensor.dtype == sources[0]["model"][name].dtype
        torch.testing.assert_close(tensor, expected, rtol=1e-6, atol=1e-7)
    # the averaged checkpoint is a usable model
    model = Transformer(build_config("tiny", 16, 16))
    model.load_state_dict(avg["model"])


def test_a_shared_embedding_is_stored_once_as_training_stores_it(run: Path):
    """Averaged tensor by tensor, the tied source/target embedding came out as two tensors, and
    the average's file held it twice: about a third larger than a checkpoint of a small model."""
    assert run_nmt("average-checkpoints", "-r", run, "--last", "3").returncode == 0
    ck = run / "checkpoints"
    avg = torch.load(ck / "checkpoint_avg.pt", weights_only=True)["model"]
    assert avg["src_embed.weight"].data_ptr() == avg["tgt_embed.weight"].data_ptr()
    assert (ck / "checkpoint_avg.pt").stat().st_size <= (ck / "checkpoint2.pt").stat().st_size


def test_inputs_lists_several_files_after_one_flag(run: Path, tmp_path: Path):
    ck = run / "checkpoints"
    out = tmp_path / "elsewhere" / "avg.pt"
    proc = run_nmt("average-checkpoints", "--inputs", ck / "checkpoint_1_100.pt", ck / "checkpoint_avg.pt",
                   "--output", out)
    assert proc.returncode == 0, proc.stderr
    avg = load_checkpoint(out)
    a, b = (load_checkpoint(ck / n)["model"] for n in ("checkpoint_1_100.pt", "checkpoint_avg.pt"))
    for name, tensor in avg["model"].items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2)
    assert avg["averaged_from"] == [str((ck / "checkpoint_1_100.pt").resolve()), str((ck / "checkpoint_avg.pt").resolve())]


def test_half_precision_checkpoints_are_accumulated_in_fp32(tmp_path: Path):
    # In bf16, 256 + 1 rounds back to 256, so a bf16 running sum would give 256/3 -> 85.5.
    cfg = build_config("tiny", 16, 16).to_dict()
    paths = []
    for i, value in enumerate([256.0, 1.0, 1.0]):
        p = tmp_path / f"c{i}.pt"
        save_checkpoint(p, {"model": {"w": torch.full((4,), value, dtype=torch.bfloat16)}, "config": cfg})
        paths.append(p)
    out = average_checkpoints(paths, tmp_path / "avg.pt")
    assert out["model"]["w"].dtype == torch.bfloat16
    assert out["model"]["w"].tolist() == [86.0] * 4


def test_fewer_checkpoints_than_asked_says_how_many_exist(run: Path):
    proc = run_nmt("average-checkpoints", "-r", run, "--last", "6")
    assert_one_line_error(proc, "--last 6", "only 5")
    proc = run_nmt("average-checkpoints", "-r", run, "--last", "3", "--kind", "epochs")
    assert_one_line_error(proc, "only 2")


def test_different_architectures_are_refused_naming_both_files(tmp_path: Path):
    a = tmp_path / "a.pt"
    b = tmp_path / "b.pt"
    make_checkpoint(a, 1, 1, 10)
    make_checkpoint(b, 2, 1, 20, arch="tiny", vocab=24)
    proc = run_nmt("average-checkpoints", "--inputs", a, b, "--output", tmp_path / "avg.pt")
    assert_one_line_error(proc, str(a), str(b), "vocab_size 16 vs 24")
    assert not (tmp_path / "avg.pt").exists()


def test_dropout_differences_do_not_block_averaging(tmp_path: Path):
    make_checkpoint(tmp_path / "a.pt", 1, 1, 10, dropout=0.1)
    make_checkpoint(tmp_path / "b.pt", 2, 1, 20, dropout=0.3)
    average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"], tmp_path / "avg.pt")
    assert (tmp_path / "avg.pt").is_file()


def test_different_parameter_names_or_shapes_are_refused(tmp_path: Path):
    ckpt = make_checkpoint(tmp_path / "a.pt", 1, 1, 10)
    extra = dict(ckpt, model={**ckpt["model"], "extra.weight": torch.zeros(2)})
    save_checkpoint(tmp_path / "b.pt", extra)
    with pytest.raises(NmtError, match=r"a\.pt and .*b\.pt: different parameters \(extra.weight\)"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"], tmp_path / "avg.pt")
    name = next(iter(ckpt["model"]))
    reshaped = dict(ckpt, model={**ckpt["model"], name: torch.zeros(3)})
    save_checkpoint(tmp_path / "c.pt", reshaped)
    with pytest.raises(NmtError, match=f"parameter {name} has shape"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "c.pt"], tmp_path / "avg.pt")


def test_a_damaged_checkpoint_is_one_line_error(tmp_path: Path):
    make_checkpoint(tmp_path / "a.pt", 1, 1, 10)
    (tmp_path / "b.pt").write_bytes(b"PK\x03\x04 not really a zip")
    proc = run_nmt("average-checkpoints", "--inputs", tmp_path / "a.pt", tmp_path / "b.pt", "-o", tmp_path / "avg.pt")
    assert_one_line_error(proc, "b.pt", "damaged")


def test_neither_or_both_selections_is_an_error(run: Path):
    assert_one_line_error(run_nmt("average-checkpoints", "-r", run), "--last N", "--inputs")
    proc = run_nmt("average-checkpoints", "-r", run, "--last", "2", "--inputs", run / "checkpoints" / "checkpoint1.pt")
    assert_one_line_error(proc, "not both")


def test_a_run_without_checkpoints_is_one_line_error(tmp_path: Path):
    assert_one_line_error(run_nmt("average-checkpoints", "-r", tmp_path, "--last", "5"), "nmt train")


def test_inputs_count_one_file_under_two_names_once_and_keep_the_span_warning(run: Path, tmp_path: Path):
    """checkpoint_last.pt is a hard link to the newest numbered checkpoint: listed with it, it
    would weigh twice. The average is of the two files, a note says so, and the span warning
    (updates 100-2000) is given for --inputs as for --last."""
    ck = run / "checkpoints"
    os.link(ck / "checkpoint2.pt", tmp_path / "last.pt")
    out = tmp_path / "avg.pt"
    proc = run_nmt("average-checkpoints", "--inputs", ck / "checkpoint_1_100.pt", ck / "checkpoint2.pt", tmp_path / "last.pt",
                   "-o", out)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "counts once" in line]
    assert len(notes) == 1 and f"{tmp_path / 'last.pt'} is {ck / 'checkpoint2.pt'}" in notes[0]
    assert "span updates 100-2000" in proc.stderr
    avg = load_checkpoint(out)
    a, b = (load_checkpoint(ck / n)["model"] for n in ("checkpoint_1_100.pt", "checkpoint2.pt"))
    for name, tensor in avg["model"].items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2)
    assert avg["averaged_updates"] == [100, 2000]
