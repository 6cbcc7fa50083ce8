"""A rename that publishes a checkpoint or a run file is followed by an fsync of its folder:
without it, a power loss can undo the rename (`nmt.run.atomic.fsync_directory`)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from nmt.preprocess.config import RECORD
from nmt.preprocess.staging import install
from nmt.run.atomic import current_umask, fsync_directory, write_text
from nmt.run.checkpoint_files import CheckpointManager

Synced = list[tuple[tuple[int, int], set[str]]]


@pytest.fixture
def synced(monkeypatch) -> Synced:
    """Every folder fsynced, as (its device and inode, the names it held then); every fsync
    still runs."""
    folders: Synced = []
    real = os.fsync

    def spy(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            folders.append(((st.st_dev, st.st_ino), set(os.listdir(fd))))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return folders


def synced_holding(synced: Synced, folder: Path, *names: str) -> list[int]:
    """The positions in `synced` of the syncs of `folder` made once it held all of `names`."""
    st = folder.stat()
    return [n for n, (key, held) in enumerate(synced) if key == (st.st_dev, st.st_ino) and set(names) <= held]


def test_an_atomic_write_syncs_its_folder_after_the_rename(tmp_path, synced):
    write_text(tmp_path / "config" / "train.json", "{}\n")
    assert synced_holding(synced, tmp_path / "config", "train.json")


def test_a_checkpoint_save_syncs_the_folder_after_linking_every_name(tmp_path, synced):
    folder = tmp_path / "checkpoints"
    names = ["checkpoint_last.pt", "checkpoint_1_5.pt", "checkpoint_best.pt"]
    CheckpointManager(folder).save({"model": {}, "config": {}}, list(names))
    assert synced_holding(synced, folder, *names)


def _staged(tmp_path: Path) -> Path:
    stage = tmp_path / "stage"
    for name in ("vocab/joint.model", "data/train.en.bin", f"config/{RECORD}.json"):
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_text("x")
    return stage


def test_a_preprocess_install_syncs_its_folders_before_and_after_the_record(tmp_path, synced):
    root = tmp_path / "run"
    root.mkdir()
    install(_staged(tmp_path), root)
    data_synced = synced_holding(synced, root, "vocab", "data")
    record_synced = synced_holding(synced, root / "config", f"{RECORD}.json")
    assert data_synced and record_synced and data_synced[0] < record_synced[0]


def test_a_preprocess_into_a_new_run_directory_syncs_its_parent(tmp_path, synced):
    install(_staged(tmp_path), tmp_path / "run")
    assert synced_holding(synced, tmp_path, "run")


def test_a_filesystem_that_cannot_sync_a_folder_is_no_error(tmp_path, monkeypatch):
    def refuse(fd: int) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refuse)
    fsync_directory(tmp_path)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_published_file_follows_the_umask_as_open_would(tmp_path, umask, mode):
    """mkstemp's 0600 used to reach checkpoints and records: a teammate could not read them."""
    before = os.umask(umask)
    try:
        write_text(tmp_path / "record.json", "{}")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "record.json").stat().st_mode) == mode


def test_a_trained_runs_checkpoints_and_records_are_readable_by_the_team(trained_tiny_run):
    expected = 0o666 & ~current_umask()  # the umask the fixture's commands ran under
    for path in [*trained_tiny_run.glob("checkpoints/*.pt"), *trained_tiny_run.glob("config/*.json")]:
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
