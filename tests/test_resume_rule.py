"""The resume rule and the training policy, in-process and table-driven.

`resolve_launch` decides which launch a `nmt train` is from the checkpoints/ folder first and
the flags second; these tables walk (checkpoint_last.pt present / damaged / missing / nothing
saved) x (the run's first launch: fresh / restore / finetune / restore with resets) x (the
flags typed now: none, the first launch's command again, the recovery hint) on fake but
well-formed checkpoints, so each cell runs in milliseconds.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

from nmt.train import policy as train_policy
from nmt.run.checkpoint import save_checkpoint
from nmt.errors import NmtError
from nmt.train.config import TrainConfig
from nmt.train.resume import FIRST_LAUNCH_ONLY, merge_settings, resolve_launch

OTHER = Path("/elsewhere/A/checkpoints/checkpoint_last.pt")
"""The checkpoint a run was restored or fine-tuned from (another run's)."""

FIRST_LAUNCHES: dict[str, dict[str, Any]] = {
    "fresh": {},
    "restore": {"restore_file": str(OTHER)},
    "finetune": {"finetune_from": str(OTHER)},
    "restore+resets": {"restore_file": str(OTHER), "reset_optimizer": True, "reset_lr_scheduler": True,
                       "reset_dataloader": True},
}


def fake_checkpoint(path: Path, update: int, train_config: dict[str, Any], optimizer: bool = True,
                    train_state: bool = True) -> None:
    """A small checkpoint with the layout nmt writes (see nmt.run.checkpoint)."""
    ckpt: dict[str, Any] = {"version": 1, "model": {"w": torch.full((2,), float(update))},
                            "config": {"d_model": 8, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 16, "n_heads": 2}}
    if train_state:
        ckpt["train_state"] = {"update": update, "epoch": 1, "updates_in_epoch": update, "lr_offset": 0}
        ckpt["train_config"] = train_config
    if optimizer:
        ckpt["optimizer"] = {"state": {}, "param_groups": []}
    save_checkpoint(path, ckpt)


def make_run(tmp_path: Path, first_launch: str, last: str) -> tuple[Path, dict[str, Any], TrainConfig]:
    """A run's checkpoints/ after a first launch of kind `first_launch` and 20 updates saved
    every 10, with checkpoint_last.pt `present`, `damaged` (truncated), `missing` or, with
    `none`, nothing saved at all. Returns (checkpoint_dir, record, the first launch's config)."""
    first = TrainConfig.from_dict({"model": {"arch": "tiny"}, "max_update": 20, "save_interval_updates": 10,
                                   **FIRST_LAUNCHES[first_launch]})
    record = {"train_config": first.to_dict()}
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    if last == "none":
        folder.rmdir()
        return folder, record, first
    for update in (10, 20):
        fake_checkpoint(folder / f"checkpoint_1_{update}.pt", update, first.to_dict())
    if last in ("present", "damaged"):
        (folder / "checkpoint_last.pt").write_bytes((folder / "checkpoint_1_20.pt").read_bytes())
    if last == "damaged":  # checkpoint_1_20.pt is damaged with it, as a hard link would be
        for name in ("checkpoint_last.pt", "checkpoint_1_20.pt"):
            with open(folder / name, "r+b") as f:
                f.truncate(100)
    return folder, record, first


def typed(first: TrainConfig, flags: str, folder: Path) -> tuple[TrainConfig, set[str]]:
    """The command line typed now: `none` (plain `nmt train -r RUN`), `same` (the first launch's
    command again) or `hint` (plain, plus the hinted --restore-file of this run)."""
    values = {"model": {"arch": "tiny"}, "max_update": 20, "save_interval_updates": 10}
    given = {"arch", "max_update", "save_interval_updates"}
    if flags == "same":
        values = first.to_dict()
        given |= {name for name in FIRST_LAUNCH_ONLY if getattr(first, name) not in (None, False)}
    elif flags == "hint":
        values["restore_file"] = str(folder / "checkpoint_1_10.pt")
        given.add("restore_file")
    return TrainConfig.from_dict(values), given


def launch_or_error(tmp_path: Path, first_launch: str, last: str, flags: str):
    folder, record, first = make_run(tmp_path, first_launch, last)
    asked, given = typed(first, flags, folder)
    try:
        return folder, resolve_launch(folder, record, asked, given)
    except NmtError as e:
        return folder, e


def first_launch_fields(cfg: TrainConfig) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in FIRST_LAUNCH_ONLY if getattr(cfg, name) not in (None, False)}


@pytest.mark.parametrize("first_launch", FIRST_LAUNCHES)
@pytest.mark.parametrize("flags", ["none", "same", "hint"])
def test_an_intact_checkpoint_last_always_resumes_and_applies_no_first_launch_flag(tmp_path, first_launch, flags):
    folder, launch = launch_or_error(tmp_path, first_launch, "present", flags)
    assert not isinstance(launch, NmtError), launch
    assert launch.mode == "resume" and launch.checkpoint_path == folder / "checkpoint_last.pt"
    assert first_launch_fields(launch.cfg) == {}
    assert launch.checkpoint["train_state"]["update"] == 20
    ignored = [n for n in launch.notes if "ignored" in n]
    assert len(ignored) == (1 if flags == "hint" else len(FIRST_LAUNCHES[first_launch]) if flags == "same" else 0)


@pytest.mark.parametrize("first_launch", FIRST_LAUNCHES)
@pytest.mark.parametrize("last", ["damaged", "missing"])
@pytest.mark.parametrize("flags", ["none", "same"])
def test_a_lost_checkpoint_last_is_refused_naming_the_newest_intact_one(tmp_path, first_launch, last, flags):
    """Whatever the record says and whatever first-launch flag is typed again: a refusal that
    names the checkpoint to continue from, never a fresh start, a restore of A or a fine-tune."""
    folder, launch = launch_or_error(tmp_path, first_launch, last, flags)
    assert isinstance(launch, NmtError), launch.mode
    newest = "checkpoint_1_10.pt" if last == "damaged" else "checkpoint_1_20.pt"
    message = str(launch)
    assert f"--restore-file {folder / newest}" in message, message
    assert "\n" not in message


@pytest.mark.parametrize("first_launch", FIRST_LAUNCHES)
@pytest.mark.parametrize("last", ["damaged", "missing"])
def test_the_hint_continues_the_run_without_applying_its_first_launch_flags_again(tmp_path, first_launch, last):
    folder, launch = launch_or_error(tmp_path, first_launch, last, "hint")
    assert not isinstance(launch, NmtError), launch
    assert launch.mode == "recover" and launch.checkpoint_path == folder / "checkpoint_1_10.pt"
    assert first_launch_fields(launch.cfg) == {}  # no second reset, no second fine-tune
    assert launch.checkpoint["train_state"]["update"] == 10
    assert "continuing from checkpoint_1_10.pt" in launch.notes[0]


@pytest.mark.parametrize("first_launch", FIRST_LAUNCHES)
def test_a_first_launch_that_saved_nothing_applies_only_what_is_typed(tmp_path, first_launch):
    """Typed again: the first launch starts over as it was. Not typed: refused, since the
    record alone would silently turn a fine-tune into training from scratch."""
    folder, record, first = make_run(tmp_path, first_launch, "none")
    asked, given = typed(first, "same", folder)
    start = {"fresh": "fresh", "finetune": "finetune"}.get(first_launch, "restore")
    if start != "fresh":  # the same command, its checkpoint A made real
        other = tmp_path / "A.pt"
        fake_checkpoint(other, 30, first.to_dict())
        starts = {k: str(other) for k in ("restore_file", "finetune_from") if getattr(asked, k)}
        asked = TrainConfig.from_dict({**asked.to_dict(), **starts})
    launch = resolve_launch(folder, record, asked, given)
    assert launch.mode == start
    assert first_launch_fields(launch.cfg).keys() == FIRST_LAUNCHES[first_launch].keys()

    plain, plain_given = typed(first, "none", folder)
    if start == "fresh":
        assert resolve_launch(folder, record, plain, plain_given).mode == "fresh"
    else:
        with pytest.raises(NmtError, match="stopped before its first checkpoint"):
            resolve_launch(folder, record, plain, plain_given)


@pytest.mark.parametrize("last", ["damaged", "missing"])
def test_a_restore_file_from_elsewhere_cannot_roll_a_run_back(tmp_path, last):
    folder, record, first = make_run(tmp_path, "fresh", last)
    elsewhere = tmp_path / "B.pt"
    fake_checkpoint(elsewhere, 5, first.to_dict())
    asked = TrainConfig.from_dict({**first.to_dict(), "restore_file": str(elsewhere)})
    with pytest.raises(NmtError, match="not one of this run's checkpoints"):
        resolve_launch(folder, record, asked, {"restore_file"})


def test_a_weights_only_checkpoint_of_the_run_cannot_restart_it_at_update_0(tmp_path):
    folder, record, first = make_run(tmp_path, "fresh", "missing")
    average = folder / "checkpoint_avg.pt"
    fake_checkpoint(average, 0, {}, optimizer=False, train_state=False)
    asked = TrainConfig.from_dict({**first.to_dict(), "restore_file": str(average)})
    with pytest.raises(NmtError, match="without a training position") as e:
        resolve_launch(folder, record, asked, {"restore_file"})
    assert "checkpoint_1_20.pt" in str(e.value)


def test_merge_applies_safe_changes_and_refuses_another_model():
    recorded = TrainConfig.from_dict({"model": {"arch": "tiny"}, "max_update": 6, "restore_file": "A.pt"})
    cfg, notes, changes = merge_settings(recorded, TrainConfig.from_dict({"max_update": 9}), {"max_update"}, resuming=True)
    assert cfg.max_update == 9 and changes == {"max_update": [6, 9]}
    assert notes == ["changed --max-update: 6 -> 9 (was recorded in this run)"]
    assert cfg.restore_file is None  # a record's first-launch flag is never the next launch's
    with pytest.raises(NmtError, match="different model"):
        merge_settings(recorded, TrainConfig.from_dict({"model": {"arch": "base"}}), {"arch"}, resuming=True)


# -- the policy: when to validate, save and stop -------------------------------------------

def policy_cfg(**kw: Any) -> SimpleNamespace:
    base = dict(patience=0, max_update=0, max_time=0.0, max_epoch=0, save_interval_updates=0,
                save_interval_minutes=0.0, validate_interval_updates=0)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, update, epoch, train_time, interrupted, stale, expected", [
    ({}, 100, 1, 10.0, False, 0, None),
    ({}, 100, 1, 10.0, True, 0, "interrupted"),
    ({"max_update": 100}, 99, 1, 0.0, False, 0, None),
    ({"max_update": 100}, 100, 1, 0.0, False, 0, "max_update"),
    ({"max_time": 60.0}, 5, 1, 59.9, False, 0, None),
    ({"max_time": 60.0}, 5, 1, 60.0, False, 0, "max_time"),
    ({"max_epoch": 2}, 5, 2, 0.0, False, 0, None),
    ({"max_epoch": 2}, 5, 3, 0.0, False, 0, "max_epoch"),
    ({"patience": 3}, 5, 1, 0.0, False, 2, None),
    ({"patience": 3, "max_update": 5}, 5, 1, 0.0, False, 3, "patience"),
    ({"max_update": 5}, 5, 1, 0.0, True, 0, "interrupted"),
])
def test_stop_reason(kw, update, epoch, train_time, interrupted, stale, expected):
    assert train_policy.stop_reason(policy_cfg(**kw), update, epoch, train_time, interrupted, stale) == expected


@pytest.mark.parametrize("kw, update, epoch_end, train_time, last_save, expected", [
    # (validate, interval_save, epoch_end, stop)
    ({}, 7, False, 0.0, 0.0, (False, False, False, None)),
    ({"save_interval_updates": 5}, 10, False, 0.0, 0.0, (True, True, False, None)),
    ({"save_interval_updates": 5}, 11, False, 0.0, 0.0, (False, False, False, None)),
    ({"validate_interval_updates": 3}, 9, False, 0.0, 0.0, (True, False, False, None)),
    ({}, 7, True, 0.0, 0.0, (True, False, True, None)),
    ({"save_interval_minutes": 10.0}, 7, False, 599.0, 0.0, (False, False, False, None)),
    ({"save_interval_minutes": 10.0}, 7, False, 601.0, 0.0, (True, True, False, None)),
    ({"save_interval_minutes": 10.0}, 7, False, 1199.0, 601.0, (False, False, False, None)),
    ({"max_update": 7}, 7, False, 0.0, 0.0, (True, True, False, "max_update")),
])
def test_after_update(kw, update, epoch_end, train_time, last_save, expected):
    state = SimpleNamespace(update=update, epoch=1, last_interval_save_time=last_save)
    d = train_policy.after_update(policy_cfg(**kw), state, epoch_end, train_time)
    assert (d.validate, d.interval_save, d.epoch_end, d.stop) == expected


def test_an_interruption_saves_checkpoint_last_only_and_does_not_validate():
    state = SimpleNamespace(update=10, epoch=1, last_interval_save_time=0.0)
    d = train_policy.after_update(policy_cfg(save_interval_updates=5), state, True, 0.0, interrupted=True)
    assert (d.validate, d.save) == (False, True)
    assert train_policy.checkpoint_names(d, 1, 10, epoch_checkpoints=True) == (["checkpoint_last.pt"], [])


@pytest.mark.parametrize("interval, epoch_end, epoch_ckpts, expected", [
    (False, False, True, (["checkpoint_last.pt"], [])),
    (True, False, True, (["checkpoint_last.pt", "checkpoint_2_40.pt"], [])),
    (False, True, True, (["checkpoint_last.pt"], ["checkpoint2.pt"])),
    (False, True, False, (["checkpoint_last.pt"], [])),
    (True, True, True, (["checkpoint_last.pt", "checkpoint_2_40.pt", "checkpoint2.pt"], [])),
])
def test_checkpoint_names(interval, epoch_end, epoch_ckpts, expected):
    decision = train_policy.Decision(validate=True, interval_save=interval, epoch_end=epoch_end, stop=None)
    assert train_policy.checkpoint_names(decision, 2, 40, epoch_ckpts) == expected


@pytest.mark.parametrize("value, best, stale, higher, expected", [
    (3.0, None, 0, False, (3.0, 0)),
    (2.0, 3.0, 2, False, (2.0, 0)),
    (3.0, 3.0, 2, False, (3.0, 3)),  # equal is not an improvement
    (30.0, 29.0, 1, True, (30.0, 0)),
    (28.0, 29.0, 1, True, (29.0, 2)),
])
def test_patience_count(value, best, stale, higher, expected):
    assert train_policy.patience_count(value, best, stale, higher) == expected


def test_minute_intervals_follow_the_training_clock_not_the_last_save():
    assert train_policy.minute_interval_crossed(590.0, 601.0, 10.0)
    assert not train_policy.minute_interval_crossed(601.0, 1190.0, 10.0)
    assert not train_policy.minute_interval_crossed(0.0, 10_000.0, 0.0)
