"""`make recipe-multi30k-distill`: a fast student distilled from the Multi30k recipe's teacher.

    teacher (the Multi30k recipe's run; trained by it first when missing) ->
    nmt distill (the training set, beam DISTILL_BEAM, the n-best hypothesis of highest chrF against the reference) ->
    the student: nmt preprocess + train (STUDENT_ARCH, the teacher's budget) + average ->
    the same student architecture on the original data, for the same budget (what distillation adds) ->
    nmt export (int8) of both models -> test_2016_flickr and val BLEU, size and sentences/s -> one table
    (printed, and RUN_DIR/summary.json)

The table decodes the teacher with beam BEAM, the students greedily; speeds are nmt translate's own
sentences/s (model loading excluded) on test_2016_flickr, with THREADS threads each, one at a
time: the native decoder and CTranslate2 (the student's int8 export). Every step is printed as
its `nmt ...` command; a second run skips what is done.

Settings (environment variables of the same name override them):
    make recipe-multi30k-distill MULTI30K_DIR=../shared/data/multi30k
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from common import (RecipeError, Step, fit_average, flag_value, main_guard, parse_setting, run_steps, settings_from_env,
                    write_json)
from multi30k import vocabulary_args, write_slice

PROG = "recipes/multi30k_distill.py"
SETTINGS: dict[str, Any] = {
    "SRC": "en",
    "TGT": "de",
    "MULTI30K_DIR": "",           # {train,val,test_2016_flickr}.{SRC,TGT}.gz (shared/data/multi30k)
    "TEACHER_RUN": "",            # the teacher's run (default: the Multi30k recipe's, runs/multi30k-SRC-TGT)
    "RUN_DIR": "",                # default: runs/multi30k-distill-SRC-TGT
    "STUDENT_ARCH": "student-mini",  # `nmt archs`: 4+1 layers, d_model 128
    "BUDGET": "",                 # the students' training budget (default: the teacher's, from its summary.json)
    "MAX_UPDATE": 0,              # stop the students after this many updates instead, if sooner
    "MAX_TOKENS": 2048,
    # the students' regularization; each left empty is the teacher recipe's choice for this machine (its
    # summary.json), so students and teacher train alike: dropout, label smoothing, vocabulary, subword samples
    "DROPOUT": "",
    "VOCAB": "",                  # joint vocabulary size
    "LABEL_SMOOTHING": "",
    "VOCAB_TYPE": "",
    "SUBWORD_SAMPLES": "",
    "SUBWORD_ALPHA": "",
    "LR": 2e-3,
    "AMP": "auto",                # the students' --amp: bf16 where the CPU has bf16 units (as the teacher's recipe)
    "WARMUP": 400,
    "AVERAGE_LAST": 5,            # of the students' interval checkpoints (the budget / 15 each)
    "BEAM": 4,                    # the teacher's beam in the table (the paper's)
    "DISTILL_BEAM": 8,            # the teacher's beam and n-best when it distills (Mozilla's: 8 and 8)
    "LENPEN": 1.4,                # the Multi30k recipe's alpha, for the teacher
    "THREADS": 2,                 # every decoding and training command
    "SLICE": 0,                   # distill only the first N training pairs (tests)
    "EVAL_LINES": 0,              # score only the first N lines of test and val (tests; 0 = all)
    "DRY_RUN": 0,
}


def build_steps(s: dict[str, Any]) -> list[Step]:
    src, tgt = s["SRC"], s["TGT"]
    data, teacher, run = Path(s["MULTI30K_DIR"]), Path(s["TEACHER_RUN"]), Path(s["RUN_DIR"])
    threads = ["--threads", str(s["THREADS"])]
    steps: list[Step] = []

    if not (teacher / "checkpoints/checkpoint_avg.pt").is_file():
        steps.append(Step("teacher: train it with the Multi30k recipe (its run is missing)", action=lambda: _teacher(s),
                          describe=f"RUN_DIR={teacher} MULTI30K_DIR={data} python recipes/multi30k.py"))

    corpus = data / "train"
    if s["SLICE"]:
        corpus = run / f"slice{s['SLICE']}" / "train"
        steps.append(Step(f"slice: the first {s['SLICE']} training pairs (for tests)",
                          action=lambda: write_slice(data, corpus.parent, (src, tgt), s["SLICE"]),
                          describe=f"write {corpus}.{{{src},{tgt}}}"))
    suffix = "" if s["SLICE"] else ".gz"
    distilled = run / "distilled"
    steps.append(Step(f"distill: the teacher translates the training set (beam {s['DISTILL_BEAM']}, chrF selection)", args=[
        "distill", "--run-dir", teacher, "--checkpoint", "checkpoint_avg.pt", "--source", f"{corpus}.{src}{suffix}",
        "--reference", f"{corpus}.{tgt}{suffix}", "--beam", s["DISTILL_BEAM"], "--lenpen", s["LENPEN"], "-o", distilled, *threads,
    ]))

    budget = ["--max-time", s["BUDGET"]] if s["BUDGET"] not in ("", "0") else []
    interval = (_seconds(s["BUDGET"]) / 60 / 15) if budget else 10.0
    for name, train in (("student", distilled / "train"), ("baseline", Path(f"{corpus}"))):
        model = run / name
        what = "the distilled pair" if name == "student" else "the original pair (what distillation adds)"
        steps.append(Step(f"{name}: preprocess {what}", args=[
            "preprocess", "--run-dir", model, "--source-lang", src, "--target-lang", tgt, "--trainpref", train,
            "--validpref", data / "val", "--testpref", data / "test_2016_flickr", "--vocab-size", s["VOCAB"],
            *vocabulary_args(s), "--workers", s["THREADS"]]))
        steps.append(Step(f"{name}: train {s['STUDENT_ARCH']} for the teacher's budget", args=[
            "train", "--run-dir", model, "--arch", s["STUDENT_ARCH"], "--max-tokens", s["MAX_TOKENS"], "--lr", s["LR"],
            "--warmup", s["WARMUP"], "--dropout", flag_value(s["DROPOUT"]), "--label-smoothing",
            flag_value(s["LABEL_SMOOTHING"]), "--amp", s["AMP"], *budget,
            *(["--max-update", s["MAX_UPDATE"]] if s["MAX_UPDATE"] else []),
            "--save-interval-minutes", round(interval, 4), "--keep-last", max(5, s["AVERAGE_LAST"]), *threads]))
        steps.append(Step(f"{name}: average its last {s['AVERAGE_LAST']} checkpoints", prepare=fit_average(s, model, "all"),
                          args=["average-checkpoints", "--run-dir", model, "--last", s["AVERAGE_LAST"], "--kind", "all"]))

    for name, model in (("teacher", teacher), ("student", run / "student"), ("baseline", run / "baseline")):
        export = run / "exports" / name
        steps.append(Step(f"export the {name} to CTranslate2, int8", prepare=_skip_if_exported(export), args=[
            "export", "--run-dir", model, "--checkpoint", "checkpoint_avg.pt", "--quantization", "int8", "-o", export]))
    steps.append(Step("measure and print the table", action=lambda: summarize(s),
                      describe=f"BLEU (test_2016_flickr, val), size and sentences/s of each; write {run / 'summary.json'}"))
    return steps


def _teacher(s: dict[str, Any]) -> None:
    env = {**os.environ, "RUN_DIR": s["TEACHER_RUN"], "MULTI30K_DIR": s["MULTI30K_DIR"], "SRC": s["SRC"], "TGT": s["TGT"]}
    if subprocess.call([sys.executable, str(Path(__file__).with_name("multi30k.py"))], env=env) != 0:
        raise RecipeError("the Multi30k recipe failed to train the teacher; see its message above")


def _skip_if_exported(export: Path):
    def prepare(step: Step) -> Optional[str]:
        return f"{export} exists" if (export / "model.bin").is_file() else None
    return prepare


def _seconds(budget: str) -> float:
    from nmt.train.config import parse_duration

    return parse_duration(budget)


def translate(model: Path, args: list[str], source: Path, hyp: Path) -> float:
    """Translate `source` into `hyp`; nmt translate's own sentences/s (loading excluded)."""
    proc = subprocess.run([sys.executable, "-m", "nmt_cli", "translate", "--run-dir", str(model), "--checkpoint",
                           "checkpoint_avg.pt", "--input", str(source), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RecipeError(f"`nmt translate -r {model}` failed: {proc.stderr.strip().splitlines()[-1:]}")
    hyp.write_text(proc.stdout, encoding="utf-8")
    return float(re.findall(r"\(([0-9.]+) sentences/s\)", proc.stderr)[-1])


def bleu(hyp: Path, ref: Path, tgt: str) -> float:
    proc = subprocess.run([sys.executable, "-m", "nmt_cli", "score", "--ref", str(ref), "--hyp", str(hyp), "--lang", tgt,
                           "--json"], capture_output=True, text=True, check=True)
    return round(json.loads(proc.stdout)["bleu"], 2)


def summarize(s: dict[str, Any]) -> None:
    import torch

    from nmt.model.config import TransformerConfig
    from nmt.model.transformer import Transformer, count_parameters

    src, tgt = s["SRC"], s["TGT"]
    data, run = Path(s["MULTI30K_DIR"]), Path(s["RUN_DIR"])
    threads = ["--threads", str(s["THREADS"])]  # not --quiet: its last line gives sentences/s
    models = {"teacher": Path(s["TEACHER_RUN"]), "student": run / "student", "baseline": run / "baseline"}
    searches = {"teacher": ["--beam", str(s["BEAM"]), "--lenpen", str(s["LENPEN"])], "student": ["--beam", "1"],
                "baseline": ["--beam", "1"]}
    rows = {}
    out = run / "hyps"
    out.mkdir(parents=True, exist_ok=True)
    if s["EVAL_LINES"]:  # the first N lines of each side, as plain text files of the same names
        import gzip

        for file in ("test_2016_flickr", "val"):
            for lang in (src, tgt):
                with gzip.open(data / f"{file}.{lang}.gz", "rt", encoding="utf-8") as f:
                    text = "".join(line for _, line in zip(range(s["EVAL_LINES"]), f))
                with gzip.open(out / f"{file}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.write(text)
        data = out
    for name, model in models.items():
        state = torch.load(model / "checkpoints/checkpoint_avg.pt", map_location="cpu", weights_only=True)
        params = count_parameters(Transformer(TransformerConfig.from_dict(state["config"])))  # a tied embedding once
        export = run / "exports" / name
        row: dict[str, Any] = {"run": str(model), "search": " ".join(searches[name]), "parameters": params,
                               "checkpoint_mb": round((model / "checkpoints/checkpoint_avg.pt").stat().st_size / 1e6, 1),
                               "int8_export_mb": round(sum(f.stat().st_size for f in export.iterdir()) / 1e6, 1)}
        for split, file in (("test", "test_2016_flickr"), ("val", "val")):
            hyp = out / f"{name}.{split}.{tgt}"
            speed = translate(model, [*searches[name], *threads], data / f"{file}.{src}.gz", hyp)
            row[f"{split}_bleu"] = bleu(hyp, data / f"{file}.{tgt}.gz", tgt)
            if split == "test":
                row["sentences_per_s_native"] = speed
        row["sentences_per_s_ct2_int8"] = translate(model, [*searches[name], *threads, "--engine", "ctranslate2",
                                                            "--ct2-model", str(export)], data / f"test_2016_flickr.{src}.gz",
                                                    out / f"{name}.test.ct2.{tgt}")
        rows[name] = row
    teacher = rows["teacher"]
    summary = {"recipe": "multi30k_distill", "threads": s["THREADS"], "student_arch": s["STUDENT_ARCH"],
               "budget": s["BUDGET"], "student_settings": {name: s[name] for name in TEACHER_DEFAULTS},
               "distilled": json.loads((run / "distilled/summary.json").read_text()), "models": rows,
               "student_speedup_native": round(rows["student"]["sentences_per_s_native"] / teacher["sentences_per_s_native"], 2),
               "student_ct2_int8_speedup_over_teacher_native": round(
                   rows["student"]["sentences_per_s_ct2_int8"] / teacher["sentences_per_s_native"], 2),
               "student_int8_size_ratio": round(rows["student"]["int8_export_mb"] / teacher["checkpoint_mb"], 3)}
    write_json(run / "summary.json", summary)
    print(f"\n=== Multi30k {src}->{tgt}: teacher {models['teacher']} (beam {s['BEAM']}) and {s['STUDENT_ARCH']} "
          f"students (greedy), {s['THREADS']} thread(s)")
    print(f"{'model':<9} {'test BLEU':>9} {'val BLEU':>8} {'params':>8} {'ckpt MB':>8} {'int8 MB':>8} "
          f"{'sent/s nmt':>10} {'sent/s ct2 int8':>15}")
    for name, r in rows.items():
        print(f"{name:<9} {r['test_bleu']:>9.2f} {r['val_bleu']:>8.2f} {r['parameters'] / 1e6:>7.1f}M {r['checkpoint_mb']:>8.1f} "
              f"{r['int8_export_mb']:>8.1f} {r['sentences_per_s_native']:>10.1f} {r['sentences_per_s_ct2_int8']:>15.1f}")
    print(f"student/teacher: {summary['student_speedup_native']}x sentences/s (nmt), "
          f"{summary['student_ct2_int8_speedup_over_teacher_native']}x (student CTranslate2 int8 vs teacher nmt); "
          f"int8 export {summary['student_int8_size_ratio']} of the teacher's checkpoint; baseline = the student "
          f"architecture on the original data")
    print(f"written: {run / 'summary.json'}", flush=True)


TEACHER_DEFAULTS: dict[str, Any] = {"BUDGET": "30m", "DROPOUT": 0.1, "LABEL_SMOOTHING": 0.1, "VOCAB": 8000,
                                    "VOCAB_TYPE": "bpe", "SUBWORD_SAMPLES": 0, "SUBWORD_ALPHA": 0.1}
"""Settings the students take from the teacher's run (its summary.json), and what they are without one."""


def _teacher_settings(summary: Path) -> dict[str, Any]:
    """The settings the teacher's recipe ran with (its summary.json), or none without one."""
    if not summary.is_file():
        return {}
    try:
        return json.loads(summary.read_text(encoding="utf-8")).get("settings", {})
    except (ValueError, AttributeError):
        raise RecipeError(f"{summary} is not a recipe summary (damaged?); re-run the teacher's recipe to write it "
                          f"again, or set BUDGET and the students' settings") from None


def settings() -> dict[str, Any]:
    s = settings_from_env(SETTINGS)
    if not s["MULTI30K_DIR"]:
        raise RecipeError("set MULTI30K_DIR to a folder of {train,val,test_2016_flickr}.{SRC,TGT}.gz "
                          "(e.g. ../shared/data/multi30k)")
    s["TEACHER_RUN"] = s["TEACHER_RUN"] or f"runs/multi30k-{s['SRC']}-{s['TGT']}"
    s["RUN_DIR"] = s["RUN_DIR"] or f"runs/multi30k-distill-{s['SRC']}-{s['TGT']}"
    teacher = _teacher_settings(Path(s["TEACHER_RUN"]) / "summary.json")
    for name, default in TEACHER_DEFAULTS.items():  # what the teacher's recipe chose, else its fixed default
        if s[name] == "":
            s[name] = teacher.get(name, default)
        s[name] = parse_setting(name, str(s[name]), default)
    return s


def main() -> None:
    s = settings()
    print(f"Multi30k {s['SRC']}->{s['TGT']} distillation in {s['RUN_DIR']}: teacher {s['TEACHER_RUN']}, students "
          f"{s['STUDENT_ARCH']} for {s['BUDGET']}" + (f" or {s['MAX_UPDATE']} updates" if s["MAX_UPDATE"] else "")
          + f" (dropout {s['DROPOUT']}, label smoothing {s['LABEL_SMOOTHING']}, {s['VOCAB']}-piece {s['VOCAB_TYPE']} vocabulary, "
            f"{s['SUBWORD_SAMPLES']} subword samples: the teacher recipe's where its summary.json says)"
          + (" (dry run: nothing is executed)" if s["DRY_RUN"] else ""), flush=True)
    run_steps(build_steps(s), s["DRY_RUN"])


if __name__ == "__main__":
    main_guard(PROG, main)
