"""The recipes end to end: Multi30k on a slice of the real data, WMT14 on a tiny fake corpus.

System tests in the sockeye sense: they run `recipes/*.py` as a user would (a subprocess,
settings in the environment; its `nmt` commands forked by tests/recipe_runner.py, each still its
own process) and check what lands in the run directory. Never a real host:
downloads are pointed at 127.0.0.1:9, where nothing listens.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ZYGOTE_ENV, _zygote_socket, run_nmt, run_script

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
UNREACHABLE = "http://127.0.0.1:9/"
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run_recipe(name: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run recipes/NAME.py with `env` added to a clean environment (no inherited recipe settings):
    forked, with its `nmt` commands, from the tests' fork server by tests/recipe_runner.py, unless
    NMT_TEST_FORK=0."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")}
    recipe = RECIPES / f"{name}.py"
    if os.environ.get("NMT_TEST_FORK", "1") == "0":
        return run_script(recipe, env={**base, **env}, cwd=REPO, timeout=timeout)
    return run_script(REPO / "tests" / "recipe_runner.py", recipe, env={**base, **env, ZYGOTE_ENV: _zygote_socket()},
                      cwd=REPO, timeout=timeout)


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def load_recipe_module(name: str):
    """Import recipes/NAME.py (its `common` sibling resolves through sys.path)."""
    if str(RECIPES) not in sys.path:
        sys.path.insert(0, str(RECIPES))
    module_name = f"recipe_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------
# Multi30k
# ---------------------------------------------------------------------------------------

MULTI30K_TINY = {
    "ARCH": "tiny", "AMP": "none", "SLICE": "1000", "VOCAB": "1000", "MAX_TOKENS": "1024", "MAX_UPDATE": "120",
    "WARMUP": "50", "LOG_INTERVAL": "40", "SAVE_INTERVAL_MINUTES": "0", "AVERAGE_LAST": "3", "AVERAGE_KIND": "all", "THREADS": "1",
    "SUBWORD_SAMPLES": "20",
}


@pytest.mark.slow
def test_multi30k_recipe_runs_the_whole_chain_and_a_second_run_does_not_retrain(small_multi30k: Path, tmp_path: Path):
    run = tmp_path / "run"
    env = {**MULTI30K_TINY, "MULTI30K_DIR": str(small_multi30k), "RUN_DIR": str(run), "MULTI30K_URL": UNREACHABLE}
    first = run_recipe("multi30k", env, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]

    # every step is shown as the exact command before it runs
    for command in ("$ nmt preprocess ", "$ nmt train ", "$ nmt average-checkpoints ", "$ nmt translate ",
                    "$ nmt score ", "--beam 4 --lenpen 1.4", "--max-time 30m --max-update 120"):
        assert command in first.stdout, command
    # every file of the chain
    for rel in ("config/preprocess.json", "config/train.json", "vocab/joint.model", "data/train.en.bin",
                "data/train.de.idx", "data/valid.de.bin", "data/test.en.bin", "checkpoints/checkpoint_last.pt",
                "checkpoints/checkpoint_avg.pt", "logs/train.jsonl", "test.score.json", "summary.json"):
        assert (run / rel).is_file(), rel
    assert len(list((run / "checkpoints").glob("checkpoint[0-9]*.pt"))) >= 3  # epoch checkpoints to average
    hyp = run / "test.hyp.de"
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 200
    assert (run / "learning_curves.png").is_file() == HAVE_MATPLOTLIB

    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert isinstance(summary["bleu"], float) and 0.0 <= summary["bleu"] <= 100.0
    assert summary["bleu_signature"].startswith("nrefs:1|case:mixed|") and "tok:13a" in summary["bleu_signature"]
    assert isinstance(summary["chrf"], float)
    # the Multi30k papers' metric beside it, labelled
    assert isinstance(summary["bleu_lc_moses"], float) and "case:lc" in summary["bleu_lc_moses_signature"]
    assert "tok:moses-de" in summary["bleu_lc_moses_signature"] and "Wu et al." in summary["bleu_lc_moses_label"]
    assert f"BLEU  {summary['bleu_lc_moses']:6.2f}  {summary['bleu_lc_moses_signature']}" in first.stdout
    # subword regularization: sampled segmentations stored, trained on
    assert "--subword-samples 20 --subword-alpha 0.1" in first.stdout and (run / "data/train.sample20.de.bin").is_file()
    assert json.loads((run / "config/train.json").read_text(encoding="utf-8"))["subword_samples"] == 20
    assert summary["updates"] == 120
    assert summary["train_time_s"] > 0 and summary["target_tokens_per_s"] > 0
    assert len(summary["averaged_from"]) == 3
    assert f"BLEU  {summary['bleu']:6.2f}  {summary['bleu_signature']}  (length ratio {summary['length_ratio']:.3f})" in first.stdout
    # output length against the reference, test and val side by side (their references differ in length)
    test_score = json.loads((run / "test.score.json").read_text(encoding="utf-8"))
    assert summary["length_ratio"] == round(test_score["hyp_len"] / test_score["ref_len"], 3) > 0
    assert f"length ratio {summary['valid_length_ratio']:.3f} (the split settings are chosen on)" in first.stdout
    assert isinstance(summary["valid_bleu"], float) and (run / "valid.hyp.de").read_text(encoding="utf-8").count("\n") == 200
    # ARCH was given, DROPOUT and LABEL_SMOOTHING left to the machine: the choice says which rule applied and why
    choice = summary["choice"]
    assert choice["auto"] == ["DROPOUT", "LABEL_SMOOTHING", "VOCAB_TYPE", "SAVE_INTERVALS"] and choice["arch"] == "tiny" and choice["precision"] == "none"
    assert choice["dropout"] == 0.1 and choice["label_smoothing"] == 0.1 and choice["vocab_type"] == "bpe"
    assert " --vocab-type bpe " in first.stdout
    assert summary["settings"]["DROPOUT"] == choice["dropout"] and "bf16 matrix units" in choice["machine"]
    assert "chose arch tiny, dropout 0.1, label smoothing 0.1" in first.stdout and "--label-smoothing 0.1" in first.stdout

    # second run: preprocessing and training are no-ops; the later steps are redone quickly
    checkpoint = run / "checkpoints" / "checkpoint_last.pt"
    stamp = checkpoint.stat().st_mtime_ns
    log_lines = (run / "logs" / "train.jsonl").read_text(encoding="utf-8").count("\n")
    second = run_recipe("multi30k", env, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    said = " ".join(second.stderr.split())  # rich wraps long lines
    assert "already preprocessed with the same settings" in said
    assert "training already finished" in said
    assert checkpoint.stat().st_mtime_ns == stamp
    assert (run / "logs" / "train.jsonl").read_text(encoding="utf-8").count("\n") == log_lines
    assert json.loads((run / "summary.json").read_text(encoding="utf-8"))["bleu"] == summary["bleu"]


def test_multi30k_recipe_without_network_or_multi30k_dir_stops_at_once_naming_the_variable(tmp_path: Path):
    proc = run_recipe("multi30k", {"RUN_DIR": str(tmp_path / "run"), "MULTI30K_URL": UNREACHABLE}, timeout=900)
    assert proc.returncode == 1
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert "download failed" in lines[0] and "MULTI30K_DIR" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "config").exists()  # nothing was preprocessed


def test_multi30k_download_fetches_the_six_files_once_from_the_base_url(multi30k_dir: Path, tmp_path: Path):
    """The download path, against a local HTTP server standing in for the multi30k/dataset repository."""
    import functools
    import http.server
    import threading

    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(multi30k_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        mod = load_recipe_module("multi30k")
        s = {**mod.SETUP, "SRC": "en", "TGT": "fr", "MULTI30K_URL": f"http://127.0.0.1:{server.server_port}/"}
        raw = tmp_path / "raw"
        mod.fetch_data(s, raw)
        names = sorted(p.name for p in raw.iterdir())
        assert names == sorted(f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "fr"))
        assert (raw / "val.fr.gz").read_bytes() == (multi30k_dir / "val.fr.gz").read_bytes()
        assert len(requests) == 6
        mod.fetch_data(s, raw)  # a second run downloads nothing
        assert len(requests) == 6
    finally:
        server.shutdown()
        server.server_close()


def test_multi30k_recipe_refuses_a_language_outside_multi30k(tmp_path: Path):
    proc = run_recipe("multi30k", {"RUN_DIR": str(tmp_path / "run"), "TGT": "es", "MULTI30K_URL": UNREACHABLE})
    assert proc.returncode == 1
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "TGT=es" in lines[0] and "en, de, fr, cs" in lines[0]


@pytest.mark.parametrize("key, value, says", [("AVERAGE_LAST", "last", "AVERAGE_LAST='last' is not an integer or auto"),
                                               ("AVERAGE_LAST", "0", "AVERAGE_LAST=0 must be at least 1"),
                                               ("SAVE_INTERVALS", "0", "SAVE_INTERVALS=0 must be at least 1"),
                                               ("SUBWORD_SAMPLES", "-2", "SUBWORD_SAMPLES=-2 must be 0 (off) or more")])
def test_multi30k_recipe_checks_its_auto_integer_settings_in_one_line(tmp_path: Path, key: str, value: str, says: str):
    proc = run_recipe("multi30k", {"RUN_DIR": str(tmp_path / "run"), key: value, "AMP": "none", "DRY_RUN": "1"})
    assert proc.returncode == 1
    lines = stderr_lines(proc)
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("average_last, intervals, interval, minutes, max_span",
                         [("5", "15", "-1", "2", "0.3333"), ("7", "30", "-1", "1", "0.2333"), ("3", "15", "1", "1", "0.1")])
def test_multi30k_recipe_warns_about_its_averaging_window_only_beyond_the_window_it_chose(
        tmp_path: Path, average_last: str, intervals: str, interval: str, minutes: str, max_span: str):
    """The last K interval checkpoints of a 30-minute budget cut into N intervals span up to K
    of them: the averaging step's span warning starts there, not at the generic 25% that the
    recipe's own default (the last 5 of 15) would trip on every run."""
    proc = run_recipe("multi30k", {"RUN_DIR": str(tmp_path / "run"), "AVERAGE_LAST": average_last, "SAVE_INTERVALS": intervals,
                                   "SAVE_INTERVAL_MINUTES": interval, "AMP": "none", "DRY_RUN": "1"})
    assert proc.returncode == 0, proc.stderr
    train = [line for line in proc.stdout.splitlines() if line.startswith("$ nmt train ")]
    assert len(train) == 1 and f"--save-interval-minutes {minutes} --keep-last {max(5, int(average_last))} " in train[0], train
    average = [line for line in proc.stdout.splitlines() if line.startswith("$ nmt average-checkpoints ")]
    assert len(average) == 1 and average[0].endswith(f"--last {average_last} --kind updates --max-span {max_span}"), average


# ---------------------------------------------------------------------------------------
# WMT14: a fake corpus in the layout of the extracted statmt.org tarballs
# ---------------------------------------------------------------------------------------

EN_WORDS = "the a man woman dog cat house car red blue big small runs sees eats walks in on with and".split()
DE_WORDS = "der ein mann frau hund katze haus auto rot blau gross klein rennt sieht isst geht in auf mit und".split()
LEXICON = dict(zip(EN_WORDS, DE_WORDS))


def fake_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Word-for-word 'translations': learnable in a few updates, shaped like parallel text."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(EN_WORDS) for _ in range(rng.randint(3, 10))]
        en = " ".join(words).capitalize() + "."
        de = " ".join(LEXICON[w] for w in words).capitalize() + "."
        pairs.append((en, de))
    return pairs


def write_parallel(folder: Path, stem: str, pairs: list[tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, lang in enumerate(("en", "de")):
        (folder / f"{stem}.{lang}").write_text("".join(p[i] + "\n" for p in pairs), encoding="utf-8")


def write_sgm(path: Path, lines: list[str], set_tag: str) -> None:
    """A WMT SGML file: <srcset>/<refset>, <doc>, one <seg id=N> per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = [f'<{set_tag} setid="newstest2014" srclang="any">', '<doc sysid="ref" docid="1" genre="news" origlang="en">']
    body += [f'<seg id="{i}"> {line}  </seg>' for i, line in enumerate(lines, 1)]
    body += ["</doc>", f"</{set_tag}>"]
    path.write_text("\n".join(body) + "\n", encoding="utf-8")


def make_fake_wmt14(root: Path, n_test: int = 30) -> Path:
    """Europarl, Common Crawl, News Commentary, newstest2013 and newstest2014 as the tarballs extract."""
    write_parallel(root / "training", "europarl-v7.de-en", fake_pairs(150, 1))
    write_parallel(root, "commoncrawl.de-en", fake_pairs(100, 2))  # the commoncrawl tarball has no folder
    write_parallel(root / "training", "news-commentary-v9.de-en", fake_pairs(100, 3))
    write_parallel(root / "dev", "newstest2013", fake_pairs(40, 4))
    test = fake_pairs(n_test, 5)
    write_sgm(root / "test-full" / "newstest2014-deen-src.en.sgm", [p[0] for p in test], "srcset")
    write_sgm(root / "test-full" / "newstest2014-deen-ref.de.sgm", [p[1] for p in test], "refset")
    # the filtered version uses the same names in test/: the recipe must take test-full's
    decoy = fake_pairs(7, 6)
    write_sgm(root / "test" / "newstest2014-deen-src.en.sgm", [p[0] for p in decoy], "srcset")
    write_sgm(root / "test" / "newstest2014-deen-ref.de.sgm", [p[1] for p in decoy], "refset")
    return root


WMT_TINY = {
    "ARCH": "tiny", "AMP": "none", "ALLOW_CPU": "1", "VOCAB": "120", "MAX_TOKENS": "512", "TOKENS_PER_UPDATE": "1024",
    "MAX_UPDATE": "6", "WARMUP": "4", "LOG_INTERVAL": "2", "THREADS": "1", "WMT14_URL": UNREACHABLE,
}


@pytest.mark.slow
def test_wmt14_recipe_runs_offline_on_a_fake_wmt14_directory(tmp_path: Path):
    data = make_fake_wmt14(tmp_path / "wmt14")
    run = tmp_path / "run"
    proc = run_recipe("wmt14_ende", {**WMT_TINY, "WMT14_DIR": str(data), "RUN_DIR": str(run)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # the whole training text, cleaned by preprocess, and test-full's newstest2014 (not the decoy)
    train_en = (run / "text" / "train.en").read_text(encoding="utf-8").splitlines()
    assert len(train_en) == 350
    assert "--update-freq 2" in proc.stdout  # round(1024 / (512 x 1 process))
    assert "--max-len 250 --max-ratio 1.5" in proc.stdout
    hyp = run / "newstest2014.hyp.de"
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 30
    assert (run / "text" / "newstest2014.en").read_text(encoding="utf-8").splitlines()[0] == fake_pairs(30, 5)[0][0]

    # both scores, printed and recorded
    assert "sacreBLEU " in proc.stdout and "nrefs:1|case:mixed" in proc.stdout
    assert "compound-split BLEU " in proc.stdout
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert isinstance(summary["bleu"], float) and isinstance(summary["compound_split_bleu"], float)
    assert summary["compound_split_bleu_verbose"].startswith("BLEU = ")
    assert summary["updates"] == 6
    assert (run / "checkpoints" / "checkpoint_avg.pt").is_file()


def test_wmt14_dry_run_prints_the_whole_plan_with_the_update_freq_computation(tmp_path: Path):
    env = {"DRY_RUN": "1", "NUM_GPUS": "2", "RUN_DIR": str(tmp_path / "run"), "WMT14_URL": UNREACHABLE}
    if shutil.which("make"):
        # -o: take the venv as installed, so the check runs offline
        proc = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "recipe-wmt14-ende"],
                              cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    else:
        proc = run_recipe("wmt14_ende", env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "round(25000 / (4096 x 2)) = 3" in out
    assert "4096 x 2 x 3 = 24576 tokens per side per update" in out
    for needle in ("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                   "training-parallel-nc-v9.tgz", "dev.tgz", "test-full.tgz", "3003 lines", "2737",
                   "$ nmt preprocess ", "--vocab-size 37000", "--max-len 250 --max-ratio 1.5",
                   "$ nmt train ", "--arch big", "--update-freq 3", "--save-interval-minutes 10",
                   "--distributed-world-size 2", "--max-update 300000",
                   "$ nmt average-checkpoints ", "--last 20 --kind updates",
                   "$ nmt translate ", "--beam 4 --lenpen 0.6", "$ nmt score ", "--compound-split"):
        assert needle in out, needle
    assert not (tmp_path / "run").exists()  # nothing ran


def test_wmt14_dry_run_for_base_averages_the_last_5():
    env = {"DRY_RUN": "1", "ARCH": "base", "NUM_GPUS": "8", "WMT14_URL": UNREACHABLE}
    proc = run_recipe("wmt14_ende", env)
    assert proc.returncode == 0, proc.stderr
    assert "--arch base" in proc.stdout and "--last 5 --kind updates" in proc.stdout
    assert "--max-update 100000" in proc.stdout and "--update-freq 1" in proc.stdout
    # the committed GPU measurement is of big: no hours are made up for base
    assert "time: not estimated: the committed GPU measurement" in proc.stdout and "of --arch big" in proc.stdout


def wmt14_dry_run(env: dict[str, str]) -> str:
    proc = run_recipe("wmt14_ende", {"DRY_RUN": "1", "WMT14_URL": UNREACHABLE, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_wmt14_dry_run_states_disk_in_gb_and_hours_that_follow_from_the_committed_results():
    """MAX_TOKENS=3125 makes 25000 tokens an update on 8 GPUs in one step, on 4 in two: the same
    updates, so half the GPUs take twice the hours, each figure from the committed measurement."""
    mod = load_recipe_module("wmt14_ende")
    rate = mod.gpu_rate()
    assert rate is not None and rate.arch == "big"
    committed = rate.path.read_text(encoding="utf-8")
    assert f"{rate.tokens_per_s:.0f}" in committed and f"{rate.host_ms:g}" in committed
    hours = {}
    for gpus, steps in ((8, 1), (4, 2)):
        out = wmt14_dry_run({"NUM_GPUS": str(gpus), "MAX_TOKENS": "3125"})
        by_tokens = 300000 * 25000 * rate.fill / (rate.tokens_per_s * gpus * 0.9) / 3600
        by_host = 300000 * steps * rate.host_ms / 1000 / 0.9 / 3600
        hours[gpus] = max(by_tokens, by_host)
        assert f"time: about {hours[gpus]:.1f} h for 300000 updates on {gpus} GPU(s), from bench/results/{rate.path.name}" in out
        assert f"x 0.9 scaling) = {by_tokens:.1f} h" in out and f"0.9 scaling = {by_host:.1f} h" in out
        assert "GPU_SCALING=0.9 is assumed" in out and "measured kind" in out
    assert hours[4] == pytest.approx(2 * hours[8])

    # disk: the checkpoints take the bytes a parameter took in bench-scale's big checkpoint, which are
    # its fp32 weights and Adam's two moments
    per_param, source = mod.checkpoint_bytes_per_parameter(mod.RESULTS)
    assert per_param == pytest.approx(12, rel=0.01) and "_bench-scale.json" in source
    checkpoint_gb = mod.model_parameters("big", 37000) * per_param / 1e9
    assert f"22 x {checkpoint_gb:.2f} GB (--arch big" in out and source in out  # the last 20, one being written, best
    total = float(out.split("disk: about ", 1)[1].split(" GB", 1)[0])
    assert 22 * checkpoint_gb < total < 22 * checkpoint_gb + 10


def test_wmt14_hours_follow_any_gpu_measurement_and_say_which_kind_they_are_for(tmp_path: Path, capsys):
    """bench_train.py's own output (no host profile): the hours are the GPU work alone, for the
    measured kind; with no measurement at all the plan says so and gives no hours."""
    mod = load_recipe_module("wmt14_ende")
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    s = {**mod.TRAINING, **mod.SETUP, "MAX_UPDATE": 300000, "MAX_TOKENS": 3125}
    mod.print_time(s, 8, 1, 25000, None, results)
    assert capsys.readouterr().out.startswith("time: not estimated: no GPU training throughput measurement")

    (results / "2027-01-01_abc1234_a100_bench-train_gpu.json").write_text(json.dumps({
        "machine": "one NVIDIA A100", "arch": "big", "max_tokens": 25000,
        "results": {"bf16": {"tgt_tokens_per_s": 100000.0, "seconds": 20.0, "updates": 200}}}), encoding="utf-8")
    rate = mod.gpu_rate(results)
    assert rate.fill == pytest.approx(0.4)  # 100000 tokens/s x 0.1 s a step / 25000
    assert mod.training_hours(300000, 25000, 1, 8, 0.9, rate) == (pytest.approx(3e9 / 720000 / 3600), None)
    assert mod.training_hours(300000, 25000, 2, 4, 0.9, rate)[0] == pytest.approx(2 * 3e9 / 720000 / 3600)
    mod.print_time(s, 8, 1, 25000, "NVIDIA H100 80GB HBM3", results)
    out = capsys.readouterr().out
    assert out.startswith("time: about 1.2 h for 300000 updates on 8 GPU(s), from bench/results/2027-01-01_abc1234_a100")
    assert "the estimate is for the measured kind, A100, not them" in out and "host:" not in out


def test_wmt14_recipe_refuses_to_train_without_a_gpu_unless_allowed(tmp_path: Path):
    mod = load_recipe_module("wmt14_ende")
    if mod.visible_gpus() > 0:
        pytest.skip("this machine has a GPU")
    proc = run_recipe("wmt14_ende", {"RUN_DIR": str(tmp_path / "run"), "WMT14_URL": UNREACHABLE})
    assert proc.returncode == 1
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "no GPU" in lines[0] and "ALLOW_CPU=1" in lines[0]
    assert not (tmp_path / "run").exists()


def test_wmt14_recipe_without_network_names_wmt14_dir(tmp_path: Path):
    proc = run_recipe("wmt14_ende", {"RUN_DIR": str(tmp_path / "run"), "ALLOW_CPU": "1", "WMT14_URL": UNREACHABLE},
                      timeout=900)
    assert proc.returncode == 1
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "download failed" in lines[0] and "WMT14_DIR" in lines[0]


def test_wmt14_fetch_extracts_the_en_de_files_from_tarballs_in_wmt14_dir(tmp_path: Path):
    """WMT14_DIR may hold the downloaded tarballs themselves: only the en-de files are extracted."""
    mod = load_recipe_module("wmt14_ende")
    extracted = make_fake_wmt14(tmp_path / "layout", n_test=5)
    (extracted / "training" / "europarl-v7.fr-en.en").write_text("not needed\n", encoding="utf-8")
    tarballs = tmp_path / "tarballs"
    tarballs.mkdir()
    members = {
        "training-parallel-europarl-v7.tgz": ["training/europarl-v7.de-en.en", "training/europarl-v7.de-en.de",
                                              "training/europarl-v7.fr-en.en"],
        "training-parallel-commoncrawl.tgz": ["commoncrawl.de-en.en", "commoncrawl.de-en.de"],
        "training-parallel-nc-v9.tgz": ["training/news-commentary-v9.de-en.en", "training/news-commentary-v9.de-en.de"],
        "dev.tgz": ["dev/newstest2013.en", "dev/newstest2013.de"],
        "test-full.tgz": ["test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm"],
    }
    for name, files in members.items():
        with tarfile.open(tarballs / name, "w:gz") as tar:
            for rel in files:
                tar.add(extracted / rel, arcname=rel)
    s = {**mod.SETUP, **mod.TRAINING, "RUN_DIR": str(tmp_path / "run"), "WMT14_DIR": str(tarballs),
         "WMT14_URL": UNREACHABLE, "ENCODING_ERRORS": "strict"}
    mod.fetch(s)
    raw = tmp_path / "run" / "raw"
    assert (raw / "training" / "europarl-v7.de-en.de").read_bytes() == (extracted / "training" / "europarl-v7.de-en.de").read_bytes()
    assert (raw / "commoncrawl.de-en.en").is_file()
    assert not (raw / "training" / "europarl-v7.fr-en.en").exists()
    mod.gather(s, tmp_path / "run" / "text")
    assert (tmp_path / "run" / "text" / "newstest2014.de").read_text(encoding="utf-8").splitlines() == \
        [p[1] for p in fake_pairs(5, 5)]


def test_wmt14_reads_plain_gzipped_test_sets_as_in_shared_data(tmp_path: Path):
    """newstest2013/2014.{en,de}.gz (the layout of ../shared/data/wmt14) are found and read."""
    mod = load_recipe_module("wmt14_ende")
    data = make_fake_wmt14(tmp_path / "wmt14", n_test=4)
    shutil.rmtree(data / "test-full")
    shutil.rmtree(data / "test")
    pairs = fake_pairs(12, 7)
    for i, lang in enumerate(("en", "de")):
        with gzip.open(data / f"newstest2014.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(p[i] + "\n" for p in pairs))
    assert mod.locate(mod.TEST, [data]) == (data / "newstest2014.en.gz", data / "newstest2014.de.gz")
    s = {**mod.SETUP, **mod.TRAINING, "RUN_DIR": str(tmp_path / "run"), "WMT14_DIR": str(data)}
    mod.gather(s, tmp_path / "run" / "text")
    assert (tmp_path / "run" / "text" / "newstest2014.en").read_text(encoding="utf-8").splitlines() == [p[0] for p in pairs]


def test_update_freq_matches_the_papers_batch_on_any_number_of_gpus():
    mod = load_recipe_module("wmt14_ende")
    assert mod.update_freq(25000, 4096, 1) == 6   # 24576 tokens per side
    assert mod.update_freq(25000, 4096, 8) == 1   # 32768: the nearest an 8-GPU update gets
    assert mod.update_freq(25000, 3125, 8) == 1   # exactly the paper's 25000
    assert mod.update_freq(25000, 2048, 4) == 3   # 24576
    assert mod.update_freq(25000, 4096, 0) == 6   # CPU: one process


def test_recipe_settings_come_from_the_environment_with_the_defaults_type():
    if str(RECIPES) not in sys.path:
        sys.path.insert(0, str(RECIPES))
    from common import RecipeError, settings_from_env

    defaults = {"ARCH": "small", "LR": 1e-3, "WARMUP": 1000, "DRY_RUN": False, "RUN_DIR": None}
    s = settings_from_env(defaults, {"LR": "5e-4", "WARMUP": "400", "DRY_RUN": "1", "RUN_DIR": "runs/x", "ARCH": ""})
    assert s == {"ARCH": "small", "LR": 5e-4, "WARMUP": 400, "DRY_RUN": True, "RUN_DIR": "runs/x"}
    with pytest.raises(RecipeError, match="WARMUP='many' is not an integer"):
        settings_from_env(defaults, {"WARMUP": "many"})


@pytest.mark.parametrize("flags, rule, samples, smoothing, average, intervals, vocab_type",
                         [("avx512_bf16, amx_bf16", "amx", 30, 0.1, 5, 15, "bpe"),
                          ("avx512_bf16", "avx512-bf16", 0, 0.2, 7, 30, "unigram")])
def test_multi30k_subword_sampling_is_chosen_by_the_kind_of_bf16_cpu(monkeypatch, flags: str, rule: str, samples: int,
                                                                     smoothing: float, average: int, intervals: int,
                                                                     vocab_type: str):
    """AMX CPUs (30+ epochs in the budget) get source-side subword sampling and average the last
    5 of 15 interval checkpoints; AVX512-BF16 CPUs without AMX (about 15 epochs, where sampling
    lost on val) do not sample, and take label smoothing 0.2 and the last 7 of 30 (which won on
    val there, with a unigram vocabulary)."""
    import importlib.util

    import nmt.device

    monkeypatch.setattr(nmt.device, "resolve_device", lambda name: __import__("torch").device("cpu"))
    monkeypatch.setattr(nmt.device, "cpu_bf16_units", lambda: (True, f"cpu flags {flags}"))
    monkeypatch.setattr(nmt.device, "cpu_flags", lambda: frozenset(flags.split(", ")))
    spec = importlib.util.spec_from_file_location("multi30k_recipe", RECIPES / "multi30k.py")
    recipe = importlib.util.module_from_spec(spec)
    if str(RECIPES) not in sys.path:
        monkeypatch.syspath_prepend(str(RECIPES))
    spec.loader.exec_module(recipe)
    s = {**recipe.TRAINING, **recipe.DECODING, **recipe.SETUP}
    choice = recipe.choose_model(s)
    assert choice["rule"] == rule and choice["precision"] == "bf16" and choice["arch"] == "small"
    assert s["SUBWORD_SAMPLES"] == samples and s["LABEL_SMOOTHING"] == smoothing
    assert s["AVERAGE_LAST"] == average and s["SAVE_INTERVALS"] == intervals and s["VOCAB_TYPE"] == vocab_type


# ---------------------------------------------------------------------------------------
# Multi30k distillation
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_multi30k_distill_recipe_distills_trains_both_students_and_prints_one_table(
        trained_tiny_run: Path, small_multi30k: Path, tmp_path: Path):
    teacher = tmp_path / "teacher"
    shutil.copytree(trained_tiny_run, teacher)
    assert run_nmt("average-checkpoints", "-r", teacher, "--last", "2").returncode == 0
    env = {"MULTI30K_DIR": str(small_multi30k), "TEACHER_RUN": str(teacher), "RUN_DIR": str(tmp_path / "distill"),
           "SLICE": "1000", "EVAL_LINES": "100", "VOCAB": "1000", "MAX_UPDATE": "30", "WARMUP": "15", "MAX_TOKENS": "1024", "AVERAGE_LAST": "2",
           "DISTILL_BEAM": "2", "THREADS": "1"}
    first = run_recipe("multi30k_distill", env, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "teacher: train it" not in first.stdout  # the teacher's run was there: reused
    summary = json.loads((tmp_path / "distill/summary.json").read_text())
    assert summary["distilled"]["lines"] == 1000 and summary["distilled"]["select"] == "chrf"
    models = summary["models"]
    assert set(models) == {"teacher", "student", "baseline"}
    for name, row in models.items():
        assert row["sentences_per_s_native"] > 0 and row["sentences_per_s_ct2_int8"] > 0, name
        assert 0 <= row["test_bleu"] <= 100 and row["int8_export_mb"] > 0
    assert models["student"]["search"] == "--beam 1" and models["teacher"]["search"].startswith("--beam 4")
    table = first.stdout[first.stdout.index("=== Multi30k"):]
    assert all(name in table for name in ("teacher", "student", "baseline")) and "sent/s ct2 int8" in table
    again = run_recipe("multi30k_distill", env, timeout=900)  # nothing retrained, nothing distilled again
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to do" in again.stderr or "already finished" in again.stderr


def test_wmt14_dry_run_with_distill_adds_the_students_steps_after_the_teachers():
    plan = wmt14_dry_run({"DISTILL": "1", "NUM_GPUS": "8", "RUN_DIR": "runs/w"})
    teacher_summary = plan.index("] summary")
    distill = plan.index("$ nmt distill --run-dir runs/w --checkpoint checkpoint_avg.pt")
    assert teacher_summary < distill
    assert "--beam 8" in plan[distill:] and "--reference runs/w/text/train.de" in plan[distill:]
    assert "$ nmt train --run-dir runs/w-student --arch student-tiny" in plan
    assert "--quantization int8" in plan
    assert "nmt distill" not in wmt14_dry_run({"NUM_GPUS": "8"})  # the paper's recipe alone by default


def test_multi30k_distill_students_train_as_the_teachers_recipe_chose_unless_told(tmp_path: Path):
    """The students take the teacher recipe's regularization for the machine (its summary.json),
    as they take its budget; a setting given in the environment wins; without a summary, the
    fixed defaults."""
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "summary.json").write_text(json.dumps({"settings": {
        "BUDGET": "7m", "DROPOUT": 0.2, "LABEL_SMOOTHING": 0.2, "VOCAB": 4000, "VOCAB_TYPE": "unigram",
        "SUBWORD_SAMPLES": 30, "SUBWORD_ALPHA": 0.1}}))
    env = {"DRY_RUN": "1", "MULTI30K_DIR": str(tmp_path), "TEACHER_RUN": str(teacher), "RUN_DIR": str(tmp_path / "d")}

    def train_and_preprocess(proc: subprocess.CompletedProcess) -> tuple[str, str]:
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        return (next(l for l in lines if l.startswith("$ nmt train --run-dir") and "/student " in l),
                next(l for l in lines if l.startswith("$ nmt preprocess --run-dir") and "/student " in l))

    train, preprocess = train_and_preprocess(run_recipe("multi30k_distill", env))
    assert "--dropout 0.2 --label-smoothing 0.2" in train and "--max-time 7m" in train
    assert "--vocab-size 4000 --vocab-type unigram --subword-samples 30 --subword-alpha 0.1" in preprocess
    train, preprocess = train_and_preprocess(run_recipe("multi30k_distill", {**env, "DROPOUT": "0.3", "VOCAB": "2000"}))
    assert "--dropout 0.3 --label-smoothing 0.2" in train and "--vocab-size 2000 " in preprocess
    (teacher / "summary.json").write_text('{"settings": {"BUDGET": "7')  # damaged: one line, no traceback
    damaged = run_recipe("multi30k_distill", env)
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr
    assert stderr_lines(damaged) == [f"recipes/multi30k_distill.py: error: {teacher / 'summary.json'} is not a recipe "
                                     f"summary (damaged?); re-run the teacher's recipe to write it again, or set BUDGET "
                                     f"and the students' settings"]
    (teacher / "summary.json").unlink()
    train, preprocess = train_and_preprocess(run_recipe("multi30k_distill", env))
    assert "--dropout 0.1 --label-smoothing 0.1" in train and "--max-time 30m" in train
    assert "--vocab-size 8000 --vocab-type bpe" in preprocess and "--subword-samples" not in preprocess
