"""`nmt train` under faults: a second writer, another vocabulary, a full disk, a read-only run
directory. Each is one line on stderr, and the run's checkpoints and logs stay as they were."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import torch

from conftest import assert_one_line_error, run_nmt, start_nmt, wait_until
from nmt.run.checkpoint import load_checkpoint
from test_faults import needs_mount, nmt_with_mount
from test_train import TINY, fresh_copy, write_corpus  # noqa


def snapshot(run: Path) -> dict[str, bytes]:
    """The bytes of every checkpoint and log of a run."""
    files = [*(run / "checkpoints").glob("*"), *(run / "logs").glob("*")]
    return {str(p.relative_to(run)): p.read_bytes() for p in files if p.is_file()}


def test_a_second_train_on_one_run_dir_is_refused_naming_the_first(prepared, tmp_path):  # noqa: F811
    args = [*TINY, "--max-update", "30", "--seed", "2", "--log-interval", "1"]
    alone = fresh_copy(prepared, tmp_path / "alone")
    assert run_nmt("train", "-r", alone, *args).returncode == 0

    run = fresh_copy(prepared, tmp_path / "run")
    first = start_nmt("train", "-r", run, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_until((run / "logs/train.jsonl").is_file)
    assert first.poll() is None, "the first run ended before the second could start"
    start = time.monotonic()
    second = run_nmt("train", "-r", run, *args)
    assert time.monotonic() - start < 5
    assert_one_line_error(second, "in use by", f"pid {first.pid}", "nmt train")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()
    a = load_checkpoint(alone / "checkpoints/checkpoint_last.pt")["model"]
    b = load_checkpoint(run / "checkpoints/checkpoint_last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (run / ".lock").exists()


def test_resuming_on_another_vocabulary_of_the_same_size_is_refused(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    assert run_nmt("train", "-r", run, *TINY, "--max-update", "2").returncode == 0
    write_corpus(tmp_path / "other", seed=9)
    for split in ("train", "valid"):  # another language pair's text, same vocabulary size
        for lang in ("en", "de"):
            text = (tmp_path / "other" / f"{split}.{lang}").read_text()
            (tmp_path / "other" / f"{split}.{lang}").write_text(text.replace("a", "q").replace("e", "z"))
    proc = run_nmt("preprocess", "-r", run, "-s", "en", "-t", "de", "--trainpref", tmp_path / "other/train",
                   "--validpref", tmp_path / "other/valid", "--vocab-size", "100", "--workers", "1", "--force")
    assert proc.returncode == 0, proc.stderr
    before = snapshot(run)
    assert_one_line_error(run_nmt("train", "-r", run, *TINY, "--max-update", "4"), "another vocabulary", "sha256")
    assert snapshot(run) == before


@needs_mount
def test_a_full_disk_during_a_save_is_one_line_and_keeps_checkpoints_and_logs(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "src")
    args = [*TINY, "--save-interval-updates", "3", "--log-interval", "1"]
    assert run_nmt("train", "-r", run, *args, "--max-update", "3").returncode == 0
    used = sum({(p.stat().st_ino): p.stat().st_size for p in run.rglob("*") if p.is_file()}.values())  # links once
    disk = tmp_path / "disk"
    disk.mkdir()
    size_k = used // 1024 + 200  # room for the run and a few log lines, not for another checkpoint
    script = f"mount -t tmpfs -o size={size_k}k tmpfs {disk} && cp -a {run} {disk}/run"
    before_names = sorted(p.name for p in (run / "checkpoints").iterdir())
    proc = nmt_with_mount(script, "train", "-r", disk / "run", *args, "--max-update", "6",
                          after=f"ls -A {disk}/run/checkpoints; md5sum {disk}/run/logs/train.jsonl {disk}/run/checkpoints/checkpoint_last.pt")
    # training logs its progress on stderr; the failure is one line, the last
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("nmt:")]
    assert errors == [proc.stderr.splitlines()[-1]] and "no space left on device" in errors[0]
    listing = proc.stdout.split()
    assert sorted(n for n in listing if n.endswith(".pt") and "/" not in n) == before_names  # no temp file left
    expected = subprocess.run(["md5sum", run / "logs/train.jsonl", run / "checkpoints/checkpoint_last.pt"],
                              capture_output=True, text=True).stdout.split()[::2]
    assert [w for w in listing if len(w) == 32] == expected  # logs cut back, checkpoint untouched


@needs_mount
def test_a_read_only_run_dir_is_one_line_and_stays_as_it_was(prepared, tmp_path):  # noqa: F811
    run = fresh_copy(prepared, tmp_path / "run")
    assert run_nmt("train", "-r", run, *TINY, "--max-update", "2").returncode == 0
    before = snapshot(run)
    proc = nmt_with_mount(f"mount --bind -o ro {run} {run}", "train", "-r", run, *TINY, "--max-update", "4")
    assert_one_line_error(proc, "read-only file system", str(run))
    assert snapshot(run) == before


def test_ctrl_c_is_taken_by_training_unless_the_process_started_with_it_ignored():
    """A script's background job (`nmt train ... &`) starts with SIGINT ignored, as the shell asks:
    training must leave it so (the terminal's Ctrl-C is meant for the script, not the job); in a
    foreground command the first Ctrl-C asks to save and stop."""
    import signal

    from nmt.train.loop import InterruptFlag

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with InterruptFlag() as flag:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
            assert not flag.raised
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with InterruptFlag() as flag:
            signal.raise_signal(signal.SIGINT)
            assert flag.raised
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
