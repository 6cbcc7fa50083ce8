"""`make recipe-multi30k`: the whole chain on Multi30k task 1, ending with a BLEU score.

Multi30k task 1 (Elliott et al. 2016): image captions, 29000 training pairs, 1014 for
validation (val), 1000 for test (test_2016_flickr), in en, de, fr and cs. The steps:

    data -> nmt preprocess (joint BPE or unigram, sampled segmentations) -> nmt train (wall-clock budget) ->
    nmt average-checkpoints -> nmt translate (beam 4, alpha chosen on val) -> nmt score (sacreBLEU; and
    lowercased Moses-tokenized, the Multi30k papers' metric) ->
    nmt plot -> summary (printed, and RUN_DIR/summary.json)

Every step is printed as the exact `nmt ...` command before it runs. A second run skips
preprocessing, resumes or skips training, and redoes the cheap later steps.

Settings: TRAINING and DECODING below (edit them, or override one for a run with the
environment variable of the same name), and SETUP for data and run directory:
    make recipe-multi30k MULTI30K_DIR=../shared/data/multi30k BUDGET=10m ARCH=tiny
"""

from __future__ import annotations

import gzip
import importlib.util
import shlex
from pathlib import Path
from typing import Any, Optional

from nmt.train.config import parse_duration

from common import (RecipeError, Step, averaged_from, download, fit_average, flag_value, format_duration, main_guard, run_steps,
                    settings_from_env, training_stats, write_json)

# ---------------------------------------------------------------------------------------
# Training defaults: the knobs that decide BLEU on a 30-minute CPU budget. Each one can be
# overridden for a run by the environment variable of the same name (ARCH=tiny make ...).
# ---------------------------------------------------------------------------------------
TRAINING: dict[str, Any] = {
    # ARCH and DROPOUT "auto" choose by what the machine can multiply, never by a timing:
    # MODEL_CHOICES below says what each kind of machine gets and the runs behind it.
    "ARCH": "auto",                # `nmt archs`, or auto (see MODEL_CHOICES)
    "VOCAB": 8000,                 # joint vocabulary size (nmt preprocess --vocab-size)
    "VOCAB_TYPE": "auto",          # bpe or unigram (SentencePiece; nmt preprocess --vocab-type), or auto (see MODEL_CHOICES)
    # Subword regularization of the source side (BPE-dropout with a bpe vocabulary, Kudo's sampling
    # with a unigram one), one sampled segmentation per epoch, or auto (see MODEL_CHOICES). Sampling
    # the target side too lost on val every time.
    "SUBWORD_SAMPLES": "auto",     # sampled segmentations of the training set (--subword-samples; 0 = off), or auto
    # --subword-alpha, whose meaning follows VOCAB_TYPE: bpe: the probability of dropping a merge (Provilkov et al.
    # 2020: 0.1); unigram: the sampling's smoothing, where 0.1 is very flat (docs/recipes.md)
    "SUBWORD_ALPHA": 0.1,
    "MAX_TOKENS": 2048,            # tokens per batch and side, padding included (--max-tokens)
    "UPDATE_FREQ": 1,              # batches accumulated per update (--update-freq)
    "LR": 2e-3,                    # peak learning rate after warmup, then inverse sqrt (--lr)
    "WARMUP": 400,                 # linear warmup updates (--warmup)
    "DROPOUT": "auto",             # residual dropout P_drop (--dropout), or auto (see MODEL_CHOICES)
    "LABEL_SMOOTHING": "auto",     # epsilon_ls (--label-smoothing; paper 0.1), or auto (see MODEL_CHOICES)
    "AMP": "auto",                 # auto (bf16 on GPUs and on CPUs with bf16 units, else fp32), bf16, fp16, none (--amp)
    "BUDGET": "30m",               # wall-clock training budget (--max-time; 0 = none)
    "MAX_UPDATE": 0,               # stop after this many updates instead, if sooner (0 = budget only)
    # Interval checkpoints every BUDGET/SAVE_INTERVALS of training time (2 min of 30 for 15) when
    # -1, on the training clock, whatever the epoch length; the final one closes the last
    # interval. Averaging the last 5 of 15 (7 of 30) then covers the last 33% (23%) of training on
    # a CPU that runs 8 epochs in the budget and on one that runs 200.
    "SAVE_INTERVALS": "auto",      # interval checkpoints in the budget, or auto (see MODEL_CHOICES)
    "SAVE_INTERVAL_MINUTES": -1.0, # --save-interval-minutes; -1 = BUDGET / SAVE_INTERVALS
    "AVERAGE_LAST": "auto",        # average the last N interval checkpoints (--keep-last follows), or auto
    "AVERAGE_KIND": "updates",     # which ones count: all, updates (interval) or epochs
    "LOG_INTERVAL": 100,           # a train record in logs/train.jsonl every N updates
    "TRAIN_ARGS": "",              # any further `nmt train` flags, e.g. "--clip-norm 1 --pre-ln"
}

# What each "auto" above becomes, by the kind of machine training will use (never by a timing):
# a CPU with AMX (or a GPU), a CPU with AVX512-BF16 and no AMX, a CPU without bf16 units (fp32).
# Each value was chosen on val at equal wall-clock time; the runs behind every row, and what was
# tried and lost: docs/recipes.md, "How the settings were chosen".
MODEL_CHOICES: dict[str, dict[str, Any]] = {
    "amx": {"ARCH": "small", "DROPOUT": 0.2, "LABEL_SMOOTHING": 0.1, "VOCAB_TYPE": "bpe", "SUBWORD_SAMPLES": 30,
            "AVERAGE_LAST": 5, "SAVE_INTERVALS": 15},
    "avx512-bf16": {"ARCH": "small", "DROPOUT": 0.2, "LABEL_SMOOTHING": 0.2, "VOCAB_TYPE": "unigram", "SUBWORD_SAMPLES": 0,
                    "AVERAGE_LAST": 7, "SAVE_INTERVALS": 30},
    "fp32": {"ARCH": "mini", "DROPOUT": 0.1, "LABEL_SMOOTHING": 0.1, "VOCAB_TYPE": "bpe", "SUBWORD_SAMPLES": 0,
             "AVERAGE_LAST": 3, "SAVE_INTERVALS": 15},
}
AUTO_INTEGERS = ("SUBWORD_SAMPLES", "AVERAGE_LAST", "SAVE_INTERVALS")
"""The integer settings among MODEL_CHOICES' keys: an environment value for them is read as an integer."""

# The paper's beam 4; the length penalty chosen on val: with the paper's alpha 0.6 these models
# write too short, and 1.4 won on both `mini` and `small` (docs/recipes.md). `nmt translate` keeps
# the paper's 0.6 as its default.
DECODING: dict[str, Any] = {
    "BEAM": 4,
    "LENPEN": 1.4,
}

# Data, languages and run directory.
SETUP: dict[str, Any] = {
    "SRC": "en",
    "TGT": "de",
    "RUN_DIR": None,          # default: runs/multi30k-SRC-TGT
    "MULTI30K_DIR": None,     # a folder with {train,val,test_2016_flickr}.{lang}.gz; unset: download
    "MULTI30K_URL": "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/",
    "DOWNLOAD_TIMEOUT": 10.0, # seconds without an answer before a download counts as failed
    "SLICE": 0,               # tests only: train on the first N pairs (0 = all 29000)
    "THREADS": 0,             # CPU threads of train/translate and preprocess workers (0 = all)
    "DRY_RUN": False,         # print the steps without running them
}

LANGUAGES = ("en", "de", "fr", "cs")
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
PROG = "recipes/multi30k.py"


def data_files(data_dir: Path, langs: tuple[str, str]) -> list[Path]:
    """The six .gz files the recipe reads: train, val and test_2016_flickr in both languages."""
    return [data_dir / f"{prefix}.{lang}.gz" for prefix in SPLITS.values() for lang in langs]


def fetch_data(s: dict[str, Any], raw_dir: Path) -> None:
    """Download the raw Multi30k files that are not in RUN_DIR/raw yet, and check each is whole gzip."""
    base = s["MULTI30K_URL"].rstrip("/") + "/"
    hint = ("without network, set MULTI30K_DIR to a folder holding the multi30k/dataset files "
            "data/task1/raw/{train,val,test_2016_flickr}.{%s,%s}.gz" % (s["SRC"], s["TGT"]))
    for path in data_files(raw_dir, (s["SRC"], s["TGT"])):
        if path.is_file():
            continue
        download(base + path.name, path, s["DOWNLOAD_TIMEOUT"], hint)
        try:
            with gzip.open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
        except (OSError, EOFError) as e:
            path.unlink()
            raise RecipeError(f"{base + path.name} did not download as a gzip file ({e}); re-run, or set MULTI30K_DIR") from None


def vocabulary_args(s: dict[str, Any]) -> list[Any]:
    """`nmt preprocess`'s vocabulary type and subword sampling flags for settings `s`."""
    sampling = ["--subword-samples", s["SUBWORD_SAMPLES"], "--subword-alpha", flag_value(s["SUBWORD_ALPHA"])]
    return ["--vocab-type", s["VOCAB_TYPE"], *(sampling if s["SUBWORD_SAMPLES"] else [])]


def write_slice(src_dir: Path, out_dir: Path, langs: tuple[str, str], n: int) -> None:
    """The first `n` training pairs as plain text; written once, so preprocessing stays a no-op."""
    for lang in langs:
        out = out_dir / f"train.{lang}"
        if out.is_file():
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        with gzip.open(src_dir / f"train.{lang}.gz", "rb") as f:
            lines = [line for _, line in zip(range(n), f)]
        tmp = out.with_name(f".{out.name}.part")
        tmp.write_bytes(b"".join(lines))
        tmp.replace(out)


def build_steps(s: dict[str, Any]) -> list[Step]:
    src, tgt = s["SRC"], s["TGT"]
    run = Path(s["RUN_DIR"])
    data_dir = Path(s["MULTI30K_DIR"]) if s["MULTI30K_DIR"] else run / "raw"
    train_dir = run / f"slice{s['SLICE']}" if s["SLICE"] else data_dir
    hyp = run / f"test.hyp.{tgt}"
    score_json = run / "test.score.json"
    valid_hyp = run / f"valid.hyp.{tgt}"
    valid_json = run / "valid.score.json"
    paper_json = run / "test.score-lc-moses.json"
    threads = ["--threads", str(s["THREADS"])] if s["THREADS"] else []
    steps: list[Step] = []

    # 1. data
    if s["MULTI30K_DIR"]:
        def check_local() -> None:
            missing = [p for p in data_files(data_dir, (src, tgt)) if not p.is_file()]
            if missing:
                raise RecipeError(f"MULTI30K_DIR={data_dir} lacks {missing[0].name}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                                  + f"; it must hold {{train,val,test_2016_flickr}}.{{{src},{tgt}}}.gz from multi30k/dataset data/task1/raw")
        steps.append(Step("data: Multi30k task 1 from MULTI30K_DIR", action=check_local,
                          describe=f"use {data_dir}/{{train,val,test_2016_flickr}}.{{{src},{tgt}}}.gz"))
    else:
        steps.append(Step("data: download Multi30k task 1", action=lambda: fetch_data(s, data_dir),
                          describe=f"fetch {s['MULTI30K_URL']}{{train,val,test_2016_flickr}}.{{{src},{tgt}}}.gz "
                                   f"into {data_dir}/ (files already there are kept)"))
    if s["SLICE"]:
        steps.append(Step(f"slice: the first {s['SLICE']} training pairs (for tests)",
                          action=lambda: write_slice(data_dir, train_dir, (src, tgt), s["SLICE"]),
                          describe=f"write {train_dir}/train.{{{src},{tgt}}}"))

    # 2. preprocess: joint vocabulary (BPE or unigram), binarized data; a no-op when already done with these settings
    steps.append(Step(f"preprocess: joint {s['VOCAB_TYPE']} vocabulary and binarized data (a no-op if already done)", args=[
        "preprocess", "--run-dir", run, "--source-lang", src, "--target-lang", tgt,
        "--trainpref", train_dir / "train", "--validpref", data_dir / SPLITS["valid"],
        "--testpref", data_dir / SPLITS["test"], "--vocab-size", s["VOCAB"], *vocabulary_args(s),
        *(["--workers", str(s["THREADS"])] if s["THREADS"] else []),
    ]))

    # 3. train: resumes from checkpoint_last.pt; does nothing when already finished
    budget = [] if s["BUDGET"] in ("", "0") else ["--max-time", s["BUDGET"]]
    save_interval = s["SAVE_INTERVAL_MINUTES"]
    if save_interval < 0:
        save_interval = round(parse_duration(s["BUDGET"]) / 60 / s["SAVE_INTERVALS"], 4) if budget else 10.0
    steps.append(Step("train (resumes from checkpoint_last.pt; nothing to do when finished)", args=[
        "train", "--run-dir", run, "--arch", s["ARCH"], "--max-tokens", s["MAX_TOKENS"],
        "--update-freq", s["UPDATE_FREQ"], "--lr", flag_value(s["LR"]), "--warmup", s["WARMUP"],
        "--dropout", flag_value(s["DROPOUT"]), "--label-smoothing", flag_value(s["LABEL_SMOOTHING"]),
        "--amp", s["AMP"], *budget, *(["--max-update", str(s["MAX_UPDATE"])] if s["MAX_UPDATE"] else []),
        "--save-interval-minutes", flag_value(save_interval), "--keep-last", max(5, s["AVERAGE_LAST"]),
        "--log-interval", s["LOG_INTERVAL"], *threads, *shlex.split(s["TRAIN_ARGS"]),
    ]))

    # 4. average the last K checkpoints (fewer, said on stderr, if training wrote fewer). The
    # window was chosen on val: warn only when the checkpoints span more of training than K
    # intervals of the budget (the last 5 of 15 span 27% of the updates, over the 25% default).
    window = ["--max-span", flag_value(round(min(1.0, s["AVERAGE_LAST"] * save_interval * 60 / parse_duration(s["BUDGET"])), 4))] \
        if budget and s["AVERAGE_KIND"] == "updates" else []
    steps.append(Step(f"average the last {s['AVERAGE_LAST']} checkpoints into checkpoint_avg.pt", prepare=fit_average(s, run, s["AVERAGE_KIND"]), args=[
        "average-checkpoints", "--run-dir", run, "--last", str(s["AVERAGE_LAST"]), "--kind", s["AVERAGE_KIND"], *window,
    ]))

    # 5. translate the test set with the averaged model
    steps.append(Step(f"translate test_2016_flickr with beam {s['BEAM']}, alpha {flag_value(s['LENPEN'])}", stdout=hyp, args=[
        "translate", "--run-dir", run, "--checkpoint", "checkpoint_avg.pt",
        "--input", data_dir / f"{SPLITS['test']}.{src}.gz", "--beam", s["BEAM"], "--lenpen", flag_value(s["LENPEN"]),
        *threads,
    ]))

    # 6. score: sacreBLEU (13a, cased) and chrF, with their signatures
    steps.append(Step("score with sacreBLEU", stdout=score_json, args=[
        "score", "--ref", data_dir / f"{SPLITS['test']}.{tgt}.gz", "--hyp", hyp, "--lang", tgt, "--json",
    ]))

    # 6a. the papers' Multi30k metric: lowercased, Moses-tokenized BLEU (Wu et al. 2021, fairseq)
    steps.append(Step("score lowercased and Moses-tokenized, as the Multi30k papers do", stdout=paper_json, args=[
        "score", "--ref", data_dir / f"{SPLITS['test']}.{tgt}.gz", "--hyp", hyp, "--lang", tgt, "--tokenize", "moses",
        "--lowercase", "--json",
    ]))

    # 6b. the same on val, the split that settings are compared on (test is never tuned on)
    steps.append(Step("translate and score val the same way (the split settings are chosen on)", stdout=valid_hyp, args=[
        "translate", "--run-dir", run, "--checkpoint", "checkpoint_avg.pt", "--subset", "valid",
        "--beam", s["BEAM"], "--lenpen", flag_value(s["LENPEN"]), *threads,
    ]))
    steps.append(Step("score val with sacreBLEU", stdout=valid_json, args=[
        "score", "--run-dir", run, "--subset", "valid", "--hyp", valid_hyp, "--json",
    ]))

    # 7. learning curves, when matplotlib (the optional `plot` extra) is installed
    def need_matplotlib(step: Step) -> Optional[str]:
        (run / "learning_curves.png").unlink(missing_ok=True)  # never report a stale picture
        if importlib.util.find_spec("matplotlib") is None:
            return "matplotlib is not installed (pip install 'nmt[plot]' to get learning_curves.png)"
        return None

    steps.append(Step("plot the learning curves into learning_curves.png", prepare=need_matplotlib,
                      args=["plot", "--run-dir", run]))

    # 8. summary
    steps.append(Step("summary", action=lambda: summarize(s, run, hyp, score_json, valid_json, paper_json),
                      describe=f"print BLEU, chrF, training time, updates and tokens/s; write {run / 'summary.json'}"))
    return steps


def summarize(s: dict[str, Any], run: Path, hyp: Path, score_json: Path, valid_json: Path, paper_json: Path) -> None:
    """Print the result in a few lines and write it as RUN_DIR/summary.json."""
    import json

    score = json.loads(score_json.read_text(encoding="utf-8"))
    valid = json.loads(valid_json.read_text(encoding="utf-8"))
    paper = json.loads(paper_json.read_text(encoding="utf-8"))
    stats = training_stats(run / "logs" / "train.jsonl")
    avg = run / "checkpoints" / "checkpoint_avg.pt"
    averaged, averaged_updates = averaged_from(avg)
    png = run / "learning_curves.png"
    summary = {
        "recipe": "multi30k",
        "task": f"Multi30k task 1 {s['SRC']}->{s['TGT']}, test_2016_flickr (1000 sentences)",
        "source_lang": s["SRC"],
        "target_lang": s["TGT"],
        "run_dir": str(run),
        "bleu": round(score["bleu"], 2),
        "bleu_signature": score["signature"],
        "bleu_verbose": score["bleu_verbose"],
        "chrf": round(score["chrf"], 2),
        "chrf_signature": score["chrf_signature"],
        "bleu_lc_moses": round(paper["bleu"], 2),
        "bleu_lc_moses_signature": paper["signature"],
        "bleu_lc_moses_label": paper["label"],
        # hypothesis/reference length (13a tokens): Multi30k's val references run longer than test's,
        # so a length setting chosen on val can overshoot test; both ratios side by side show it
        "length_ratio": round(score["ratio"], 3),
        "valid_bleu": round(valid["bleu"], 2),
        "valid_chrf": round(valid["chrf"], 2),
        "valid_length_ratio": round(valid["ratio"], 3),
        "hypotheses": str(hyp),
        "checkpoint": "checkpoint_avg.pt",
        "averaged_from": averaged,
        "averaged_updates": averaged_updates,
        "averaging_note": s.get("AVERAGING_NOTE"),
        **stats,
        "learning_curves": str(png) if png.is_file() else None,
        "settings": {**{k: s[k] for k in TRAINING}, **{k: s[k] for k in DECODING}, "SLICE": s["SLICE"]},
        "choice": s["CHOICE"],
    }
    write_json(run / "summary.json", summary)
    tps = f"{stats['target_tokens_per_s']:,.0f} target tokens/s" if stats["target_tokens_per_s"] else "tokens/s not logged"
    print(f"\n=== Multi30k {s['SRC']}->{s['TGT']} test_2016_flickr, arch {s['ARCH']}, dropout {flag_value(s['DROPOUT'])}, "
          f"{s['CHOICE']['precision']}, "
          f"average of {len(averaged)} checkpoint(s) (updates {', '.join(map(str, averaged_updates))} "
          f"of {stats['updates']})")
    print(f"BLEU  {summary['bleu']:6.2f}  {score['signature']}  (length ratio {summary['length_ratio']:.3f})")
    print(f"chrF  {summary['chrf']:6.2f}  {score['chrf_signature']}")
    print(f"BLEU  {summary['bleu_lc_moses']:6.2f}  {paper['signature']}  (lowercased, Moses-tokenized: the convention "
          f"of Wu et al. 2021 and fairseq's Multi30k numbers, not comparable with the line above)")
    print(f"val   BLEU {summary['valid_bleu']:.2f}, chrF {summary['valid_chrf']:.2f}, length ratio "
          f"{summary['valid_length_ratio']:.3f} (the split settings are chosen on)")
    print(f"training: {format_duration(stats['train_time_s'])}, {stats['updates']} updates, "
          f"epoch {stats['epochs']}, {tps}")
    print(f"written: {run / 'summary.json'}, {hyp}" + (f", {png}" if png.is_file() else ""), flush=True)


def choose_model(s: dict[str, Any]) -> dict[str, Any]:
    """Resolve every "auto" among MODEL_CHOICES' keys by the precision training will use and,
    for bf16 on a CPU, whether it has AMX; return what was chosen and why (printed, and kept in
    summary.json)."""
    import torch

    from nmt.device import cpu_bf16_units, cpu_flags, resolve_amp, resolve_device

    device = resolve_device("auto")  # what `nmt train --device auto` will train on
    amp = resolve_amp(s["AMP"], device, "train")
    if device.type == "cuda":
        why = f"GPU {torch.cuda.get_device_name(0)}, --amp {s['AMP']} -> {amp}"
        fast = True
    else:
        units, evidence = cpu_bf16_units()
        why = f"CPU {'with' if units else 'without'} bf16 matrix units ({evidence}), --amp {s['AMP']} -> {amp}"
        fast = "amx_bf16" in cpu_flags()
    kind = "fp32" if amp == "none" else "amx" if fast else "avx512-bf16"
    chosen = {key: (value if s[key] == "auto" else s[key]) for key, value in MODEL_CHOICES[kind].items()}
    auto = [key for key in MODEL_CHOICES[kind] if s[key] == "auto"]
    s.update(chosen)
    return {"precision": amp, "machine": why, "rule": kind, "auto": auto, **{k.lower(): v for k, v in chosen.items()}}


def settings() -> dict[str, Any]:
    s = settings_from_env({**TRAINING, **DECODING, **SETUP})
    for key in ("SRC", "TGT"):
        if s[key] not in LANGUAGES:
            raise RecipeError(f"{key}={s[key]} is not a Multi30k task 1 language; choose one of {', '.join(LANGUAGES)}")
    if s["SRC"] == s["TGT"]:
        raise RecipeError(f"SRC and TGT are both {s['SRC']}; choose two different languages")
    if s["BUDGET"] in ("", "0") and not s["MAX_UPDATE"]:
        raise RecipeError("BUDGET=0 and no MAX_UPDATE would train forever; set one of them")
    if s["BUDGET"] not in ("", "0"):
        from nmt.errors import NmtError

        try:
            parse_duration(s["BUDGET"])
        except NmtError as e:
            raise RecipeError(f"BUDGET: {e}") from None
    for key in AUTO_INTEGERS:
        if s[key] != "auto":
            try:
                s[key] = int(s[key])
            except ValueError:
                raise RecipeError(f"{key}={s[key]!r} is not an integer or auto") from None
    s["RUN_DIR"] = s["RUN_DIR"] or f"runs/multi30k-{s['SRC']}-{s['TGT']}"
    s["CHOICE"] = choose_model(s)
    for key in ("AVERAGE_LAST", "SAVE_INTERVALS"):
        if s[key] < 1:
            raise RecipeError(f"{key}={s[key]} must be at least 1")
    if s["SUBWORD_SAMPLES"] < 0:
        raise RecipeError(f"SUBWORD_SAMPLES={s['SUBWORD_SAMPLES']} must be 0 (off) or more")
    return s


def main() -> None:
    s = settings()
    run = Path(s["RUN_DIR"])
    print(f"Multi30k task 1 {s['SRC']}->{s['TGT']} in {run}: arch {s['ARCH']}, budget {s['BUDGET']}"
          + (f" or {s['MAX_UPDATE']} updates" if s["MAX_UPDATE"] else "")
          + (f", first {s['SLICE']} training pairs only" if s["SLICE"] else "")
          + (" (dry run: nothing is executed)" if s["DRY_RUN"] else ""), flush=True)
    c = s["CHOICE"]
    if c["auto"]:
        print(f"chose arch {c['arch']}, dropout {flag_value(c['dropout'])}, label smoothing {flag_value(c['label_smoothing'])}, "
              f"{c['vocab_type']} vocabulary, {c['subword_samples']} subword samples, "
              f"average of the last {c['average_last']} of {c['save_intervals']} interval checkpoints ({', '.join(c['auto'])} = auto): "
              f"{c['machine']}; see MODEL_CHOICES in {PROG}", flush=True)
    run_steps(build_steps(s), s["DRY_RUN"])


if __name__ == "__main__":
    main_guard(PROG, main)
