"""Faults and bad input end in one line on stderr, never a traceback, and touch nothing already there.

Full disks and read-only run directories are real where the test may mount (a private mount
namespace through `unshare -m`, as root); elsewhere those tests skip, and the same errors are
injected into the command line in-process instead.
"""

from __future__ import annotations

import array
import errno
import fcntl
import gzip
import os
import random
import shutil
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, assert_one_line_error, finish, paused_in_time, run_nmt, start_nmt
from nmt.run.checkpoint import save_checkpoint
from nmt.run.identity import run_identity
from nmt.model.transformer import Transformer
from nmt.model.config import build_config
from nmt.run.directory import RunDir
from nmt.data.tokenizer import UNK_ID, UNK_SURFACE, load_tokenizer, train_tokenizer
from test_identity import VOCAB, make_run, save_model

WORDS = "a man rides a bike across the street two dogs play in the snow while children laugh".split()


def write_corpus(prefix: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for lang in ("en", "de"):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]
        Path(f"{prefix}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if "preprocess-tmp" in p.name or p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A run directory with checkpoints, a training log and a vocabulary."""
    run = make_run(tmp_path_factory.mktemp("trained") / "run", " ".join(WORDS), 0)
    for update in (10, 20):
        save_model(run / "checkpoints" / f"checkpoint_1_{update}.pt", update, run_identity(RunDir(run)), update)
    shutil.copyfile(run / "checkpoints" / "checkpoint_1_20.pt", run / "checkpoints" / "checkpoint_last.pt")
    (run / "logs").mkdir()
    (run / "logs" / "train.jsonl").write_text(
        "".join(f'{{"kind": "train", "update": {u}, "epoch": 1, "loss": {5 - u / 10}, "lr": 0.001}}\n' for u in (5, 10, 15)))
    return run


# -- private mounts (root in a private mount namespace) ---------------------------------------

def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="cannot mount in a private namespace here (not root?)")


def nmt_with_mount(mount: str, *args: str | Path, after: str = "true") -> subprocess.CompletedProcess:
    """`nmt ARGS` in a private mount namespace after the shell command `mount`; the mount
    vanishes with the process. `after` runs in the namespace afterwards (its output on stdout)."""
    script = f'{mount} || exit 99; "$0" -m nmt_cli "$@"; rc=$?; {after}; exit $rc'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, sys.executable, *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 99, proc.stderr
    return proc


@needs_mount
def test_a_full_disk_in_preprocess_is_one_line_and_leaves_nothing(tmp_path):
    write_corpus(tmp_path / "c", 3000)
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = nmt_with_mount(f"mount -t tmpfs -o size=64k tmpfs {disk}", "preprocess", "-s", "en", "-t", "de",
                          "--trainpref", tmp_path / "c", "--vocab-size", "40", "-j", "1", "-r", disk / "run",
                          after=f"ls -A {disk}")
    assert_one_line_error(proc, "no space left on device", "free some space")
    assert proc.stdout.split() == []  # no run dir, no staging folder, no lock file


@needs_mount
def test_a_full_disk_in_average_is_one_line_and_checkpoints_stay(trained_run):
    before = snapshot(trained_run)
    (trained_run / "full").mkdir()
    proc = nmt_with_mount(f"mount -t tmpfs -o size=16k tmpfs {trained_run / 'full'}", "average-checkpoints",
                          "-r", trained_run, "--last", "2", "-o", trained_run / "full" / "avg.pt")
    (trained_run / "full").rmdir()
    assert_one_line_error(proc, "no space left on device", str(trained_run / "full" / "avg.pt"))
    assert snapshot(trained_run) == before


@needs_mount
@pytest.mark.parametrize("command", [("average-checkpoints", "--last", "2"), ("plot",)])
def test_a_read_only_run_dir_is_one_line_and_stays_as_it_was(trained_run, command):
    before = snapshot(trained_run)
    proc = nmt_with_mount(f"mount --bind -o ro {trained_run} {trained_run}", *command, "-r", trained_run)
    assert_one_line_error(proc, "read-only file system", str(trained_run), "writable")
    assert snapshot(trained_run) == before


def test_a_full_disk_on_stdout_is_one_line(tmp_path):
    (tmp_path / "h.txt").write_text("a man\n")
    with open("/dev/full", "w") as full:
        proc = finish(start_nmt("score", "--ref", tmp_path / "h.txt", "--hyp", tmp_path / "h.txt", stdout=full,
                                stderr=subprocess.PIPE, text=True), timeout=900)
    assert_one_line_error(proc, "no space left on device")


def test_translate_to_a_full_disk_is_one_line(trained_run):
    before = snapshot(trained_run)
    with open("/dev/full", "w") as full:
        proc = finish(start_nmt("translate", "--threads", "1", "-q", "-r", trained_run, "--max-len-b", "3",
                                stdin=subprocess.PIPE, stdout=full, stderr=subprocess.PIPE, text=True),
                      "a man\n" * 5, timeout=900)
    assert_one_line_error(proc, "no space left on device")
    assert snapshot(trained_run) == before


@pytest.mark.parametrize("code,needle", [
    (errno.ENOSPC, "free some space"), (errno.EROFS, "read-only"), (errno.EACCES, "permissions"),
    (errno.EISDIR, "give a file name"), (errno.ENOTDIR, "not a folder"),
])
def test_os_errors_are_one_line_naming_the_path(monkeypatch, capsys, tmp_path, code, needle):
    """Injected where no mount is possible: the error as the OS raises it, from deep in a command."""
    from nmt_cli import main as cli

    target = tmp_path / "somewhere" / "learning_curves.png"

    def failing(jsonl, png):
        raise OSError(code, os.strerror(code), str(target))

    monkeypatch.setattr("nmt.train.plot.plot_learning_curves", failing)
    monkeypatch.setattr(sys, "argv", ["nmt", "plot", "-r", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("nmt: error: ") and str(target) in err and needle in err


# -- Ctrl-C -----------------------------------------------------------------------------------

def test_ctrl_c_says_interrupted_and_exits_130(tmp_path):
    """Ctrl-C while `nmt score` waits for more hypotheses on stdin. The interrupt is sent once the
    command is blocked reading (it has taken the first line and asked the kernel for more), and
    stdin stays open until it has exited: closing it earlier could hand a slow machine an end of
    input to act on before the signal, and a line-count error instead of the interrupt."""
    (tmp_path / "ref").write_text("a\nb\n")
    proc = start_nmt("score", "--ref", tmp_path / "ref", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(b"a\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 120
    while not _blocked_reading_stdin(proc):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=900) == 130
    assert proc.stderr.read().decode().strip() == "nmt: interrupted"
    proc.stdin.close()


def _blocked_reading_stdin(proc: subprocess.Popen) -> bool:
    """Whether the process has read everything written to its stdin and sleeps in read(0, ...)
    (/proc/PID/syscall: syscall 0 is read on x86-64, then its first argument, the fd; elsewhere
    the pipe being empty is taken as enough)."""
    unread = array.array("i", [0])
    fcntl.ioctl(proc.stdin.fileno(), termios.FIONREAD, unread)
    if unread[0]:
        return False
    try:
        fields = Path(f"/proc/{proc.pid}/syscall").read_text().split()
    except OSError:
        return True
    return os.uname().machine != "x86_64" or fields[:2] == ["0", "0x0"]


# -- gzip ------------------------------------------------------------------------------------

def test_a_gz_that_is_not_gzip_is_one_line(tmp_path):
    write_corpus(tmp_path / "c", 50)
    for lang in ("en", "de"):
        shutil.copyfile(tmp_path / f"c.{lang}", tmp_path / f"bad.{lang}.gz")
    proc = run_nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "bad", "--vocab-size", "30",
                   "-r", tmp_path / "run")
    assert_one_line_error(proc, "bad.en.gz", "not gzip")
    assert not (tmp_path / "run").exists()


def test_a_truncated_gz_names_the_file_and_the_line_reached(tmp_path):
    write_corpus(tmp_path / "c", 20000)
    for lang in ("en", "de"):
        data = gzip.compress((tmp_path / f"c.{lang}").read_bytes())
        (tmp_path / f"cut.{lang}.gz").write_bytes(data[: len(data) // 2])
    proc = run_nmt("score", "--ref", tmp_path / "cut.de.gz", "--hyp", tmp_path / "c.de")
    assert_one_line_error(proc, "cut.de.gz", "damaged after line")
    assert "Aborted" not in proc.stderr
    line = int(proc.stderr.split("after line ")[1].split()[0])
    assert 0 < line < 20000


# -- small gaps -------------------------------------------------------------------------------

def test_archs_with_vocab_size_0_is_one_line():
    assert_one_line_error(run_nmt("archs", "--vocab-size", "0"), "--vocab-size")


def test_negative_max_len_b_is_refused(trained_run):
    assert_one_line_error(run_nmt("translate", "-r", trained_run, "--max-len-b", "-100", input="a man\n"),
                          "--max-len-b")


def test_score_with_empty_hypotheses_and_references_is_one_line(tmp_path):
    (tmp_path / "empty").write_text("")
    assert_one_line_error(run_nmt("score", "--ref", tmp_path / "empty", "--hyp", tmp_path / "empty"), "no hypotheses")


def test_score_utf8_advice_names_a_flag_it_has(tmp_path):
    (tmp_path / "bad").write_bytes(b"a \xff man\n")
    proc = run_nmt("score", "--ref", tmp_path / "bad", "--hyp", tmp_path / "bad")
    assert_one_line_error(proc, "--encoding-errors replace", "line 1")
    fixed = run_nmt("score", "--ref", tmp_path / "bad", "--hyp", tmp_path / "bad", "--encoding-errors", "replace")
    assert fixed.returncode == 0, fixed.stderr
    assert "= 100.00" in fixed.stdout  # chrF of a line with itself


def test_plot_output_naming_a_folder_is_one_line(trained_run, tmp_path):
    assert_one_line_error(run_nmt("plot", "-r", trained_run, "-o", tmp_path), "is a folder", "learning_curves.png")


def test_run_dir_under_a_regular_file_is_refused_before_any_work(tmp_path):
    write_corpus(tmp_path / "c", 50)
    (tmp_path / "file").write_text("not a folder")
    proc = run_nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "c", "--vocab-size", "30",
                   "-r", tmp_path / "file" / "run")
    assert_one_line_error(proc, "is a file, not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.de", "c.en", "file"]


def test_a_sentence_without_a_finite_hypothesis_is_counted_in_a_warning(trained_run, tmp_path):
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", VOCAB, VOCAB, max_positions=32))
    broken = {name: torch.full_like(t, float("nan")) if t.is_floating_point() else t
              for name, t in model.state_dict().items()}
    save_checkpoint(tmp_path / "nan.pt", {"model": broken, "config": model.cfg.to_dict(),
                                          "identity": run_identity(RunDir(trained_run))})
    proc = run_nmt("translate", "--threads", "1", "-q", "-r", trained_run, "-c", tmp_path / "nan.pt",
                   input="a man\n\ntwo dogs\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "\n\n\n"  # every line still answered, in order
    assert "warning: 2 line(s) got an empty translation" in proc.stderr


# -- preprocess leftovers, WordPiece determinism, <unk> ------------------------------------------

def preprocess_args(tmp_path: Path, *args: str) -> list:
    """`nmt preprocess` of the corpus tmp_path/c.{en,de} into tmp_path/run."""
    return ["preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "c", "--vocab-size", "40", "-r", tmp_path / "run",
            *args]


def preprocess_paused_mid_binarize(tmp_path: Path, *args: str, group: bool = False, **popen) -> subprocess.Popen:
    """`nmt preprocess ARGS` on tmp_path/c into tmp_path/run, paused (SIGSTOP; with `group`, its
    workers too) the moment binarizing shows and checked to be still mid-work; where the whole
    command had already finished by then (this process was not scheduled in time), it tries
    again on a corpus four times larger. The caller signals it and resumes it (SIGCONT)."""

    def binarizing() -> bool:
        return any(tmp_path.glob(".run.preprocess-tmp-*/data/train.en.bin"))

    for lines in (150_000, 600_000, 2_400_000):
        write_corpus(tmp_path / "c", lines)
        proc = start_nmt(*preprocess_args(tmp_path, *args), stderr=subprocess.PIPE, start_new_session=group, **popen)
        if paused_in_time(proc.pid, lambda: binarizing() or proc.poll() is not None,
                          lambda: proc.poll() is None and not (tmp_path / "run").exists(), timeout=600, group=group):
            return proc
        proc.communicate(timeout=600)
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
    pytest.fail("preprocess finished before it could be stopped, three times")


def test_a_preprocess_killed_mid_binarize_is_cleaned_up_by_the_next_run(tmp_path):
    """SIGKILL while binarizing (the run paused mid-work first: preprocess_paused_mid_binarize)."""
    proc = preprocess_paused_mid_binarize(tmp_path, "-j", "1")
    proc.kill()
    proc.wait()
    assert len(leftovers(tmp_path)) >= 1 and not (tmp_path / "run").exists()

    again = run_nmt(*preprocess_args(tmp_path, "-j", "1"))
    assert again.returncode == 0, again.stderr
    assert "removed 1 staging folder(s) left by an interrupted preprocess" in again.stderr
    assert "no longer running" in again.stderr  # the killed run's lock file, taken over
    assert leftovers(tmp_path) == [] and not (tmp_path / ".run.lock").exists()
    pairs = sum(1 for _ in open(tmp_path / "c.en", encoding="utf-8"))  # 150,000 unless a retry grew it
    assert RunDir(tmp_path / "run").read_record("preprocess")["splits"]["train"]["pairs"] == pairs


def test_wordpiece_vocabularies_are_identical_for_the_same_input(tmp_path):
    """HF's trainer alone gives continuation pieces ids in hash-map order, new in each process:
    on this corpus (many merges of equal counts) its vocabulary differed in each of 3 runs."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzäöü") for _ in range(rng.randint(2, 9))) for _ in range(400)]
    for lang in ("en", "de"):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(2000)]
        (tmp_path / f"c.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    files = []
    for i in range(3):
        proc = run_nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "c", "--vocab-type",
                       "wordpiece", "--vocab-size", "300", "-r", tmp_path / f"run{i}")
        assert proc.returncode == 0, proc.stderr
        files.append((tmp_path / f"run{i}" / "vocab" / "joint.json").read_bytes())
    assert files[0] == files[1] == files[2]
    tok = load_tokenizer(tmp_path / "run0" / "vocab" / "joint.json")
    assert tok.encode(["#"]) != [[UNK_ID]]  # the continuation pieces are ordinary pieces, not special tokens
    assert tok.decode(tok.encode([" ".join(words[:20])])) == [" ".join(words[:20])]


@pytest.mark.parametrize("vocab_type,name", [("bpe", "v.model"), ("wordpiece", "v.json")])
def test_unk_decodes_the_same_with_both_tokenizers(tmp_path, vocab_type, name):
    lines = [" ".join(random.Random(i).choice(WORDS) for _ in range(6)) for i in range(300)]
    tok = load_tokenizer(train_tokenizer(vocab_type, lines, 60, tmp_path / name, num_threads=1))
    ids = tok.encode(["a man 漢 rides"])[0]
    assert UNK_ID in ids
    text = tok.decode([ids])[0]
    assert UNK_SURFACE.strip() in text and "<unk>" not in text
    assert text.startswith("a man") and text.endswith("rides")


def test_temp_files_of_a_killed_write_are_removed_by_the_next_writer(trained_run, tmp_path):
    ck = trained_run / "checkpoints"
    left = ck / ".checkpoint_last.pt.k1ll3d_x.tmp"  # as atomic_path names them
    left.write_bytes(b"half a checkpoint")
    proc = run_nmt("average-checkpoints", "-r", trained_run, "--last", "2", "-o", ck / "avg_test.pt")
    assert proc.returncode == 0, proc.stderr
    assert f"removed 1 temporary file(s) left by an interrupted write: {left}" in proc.stderr
    assert not left.exists() and (ck / "avg_test.pt").is_file()
    (ck / "avg_test.pt").unlink()


def test_ctrl_c_in_preprocess_leaves_no_staging_folder_nor_lock(tmp_path):
    """Ctrl-C while the worker processes binarize. The command and its workers are stopped
    (SIGSTOP, as Ctrl-Z does) the moment binarizing shows, so that the interrupt lands mid-work
    however slow or loaded the machine; where the whole command had already finished by then
    (the test process was not scheduled in time), it tries again on a corpus four times larger."""
    proc = preprocess_paused_mid_binarize(tmp_path, "-j", "2", group=True, text=True)
    proc.send_signal(signal.SIGINT)
    os.killpg(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and err.strip() == "nmt: interrupted", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.de", "c.en"]
