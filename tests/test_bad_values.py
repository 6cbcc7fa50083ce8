"""Bad values are user errors, one line naming the flag (or the file), never a traceback.

Every int and float field of every settings dataclass declares its range (`nmt.settings`); each
is walked here with NaN, infinities, -1, one past each end and a huge value, through
`validate()` as Python callers and the CLI alike reach it. A few end-to-end runs check that
what the command line parses (click reads "nan" as a float) reaches the dataclass. Crafted
checkpoints of the wrong layout are refused by `load_checkpoint`, naming the file.
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields, replace
from typing import Any

import pytest
import torch

from conftest import assert_one_line_error, run_nmt
from nmt.run.checkpoint import load_checkpoint, save_checkpoint
from nmt.errors import NmtError
from nmt.model.config import TransformerConfig, build_config
from nmt.preprocess.config import PreprocessConfig
from nmt.inference.sampling_config import SamplingConfig
from nmt.serve.config import ServeConfig
from nmt.train.config import ModelSettings, TrainConfig
from nmt.inference.config import MAX_BEAM, SearchConfig, TranslateConfig

VALID = {  # a valid instance of each settings class; each test changes one field
    TrainConfig: TrainConfig(),
    SearchConfig: SearchConfig(),
    TranslateConfig: TranslateConfig(),
    ServeConfig: ServeConfig(),
    SamplingConfig: SamplingConfig(sampling=True),
    PreprocessConfig: PreprocessConfig(source_lang="en", target_lang="de", trainpref="corpus/train"),
    TransformerConfig: build_config("tiny", 100, 100),
}
HUGE = 10**30


def bad_values(cls: type, name: str) -> list[Any]:
    """NaN, the infinities, -1 where it means nothing, one past each end of the range, and huge."""
    allowed = cls.RANGES[name]
    integer = int in (typing.get_type_hints(cls)[name], *typing.get_args(typing.get_type_hints(cls)[name]))
    step = 1 if integer else 1e-3 * max(1.0, abs(allowed.low))
    values: list[Any] = [math.nan, math.inf, -math.inf, allowed.low - step, -HUGE]
    if allowed.low > -1:
        values.append(-1)
    if math.isfinite(allowed.high):
        values += [allowed.high + step, HUGE]
    if allowed.low_open:
        values.append(allowed.low)
    if allowed.high_open and math.isfinite(allowed.high):
        values.append(allowed.high)
    return values


def numeric_fields(cls: type) -> list[str]:
    """The int and float fields of a settings dataclass (optional ones too): each needs a range."""
    hints = typing.get_type_hints(cls)
    return [f.name for f in fields(cls) if {int, float} & {hints[f.name], *typing.get_args(hints[f.name])}]


CASES = [(cls, name, value) for cls in VALID for name in numeric_fields(cls) for value in bad_values(cls, name)]


@pytest.mark.parametrize("cls", VALID, ids=lambda c: c.__name__)
def test_every_numeric_setting_declares_its_range(cls):
    assert set(numeric_fields(cls)) == set(cls.RANGES)
    VALID[cls].validate()  # and the defaults lie inside


def test_the_model_flags_of_train_are_checked_by_the_model_s_ranges():
    assert set(numeric_fields(ModelSettings)) <= set(TransformerConfig.RANGES)


@pytest.mark.parametrize("cls,name,value", CASES, ids=[f"{c.__name__}.{n}={v!r}" for c, n, v in CASES])
def test_a_bad_number_is_refused_naming_the_flag(cls, name, value):
    with pytest.raises(NmtError) as refused:
        replace(VALID[cls], **{name: value}).validate()
    message = str(refused.value)
    assert message.startswith(f"--{name.replace('_', '-')} must be") and "\n" not in message


@pytest.mark.parametrize("name", sorted(f.name for f in fields(ModelSettings) if f.name in TransformerConfig.RANGES))
def test_a_bad_model_flag_of_train_is_refused_before_any_work(name):
    for value in bad_values(TransformerConfig, name):
        with pytest.raises(NmtError, match=f"^--{name.replace('_', '-')} must be"):
            TrainConfig(model=ModelSettings(**{name: value})).validate()


@pytest.mark.parametrize("cls,name,value", [
    (TrainConfig, "adam_eps", "1e-9"), (TrainConfig, "max_tokens", 4096.0), (TrainConfig, "seed", True),
    (SearchConfig, "lenpen", None),
])
def test_a_value_of_the_wrong_type_is_refused_not_crashed_on(cls, name, value):
    with pytest.raises(NmtError, match=f"--{name.replace('_', '-')} must be (an integer|a number)"):
        replace(VALID[cls], **{name: value}).validate()


@pytest.mark.parametrize("cls,changes", [
    (TrainConfig, {"keep_last": -1, "keep_last_epochs": -1}),  # -1: keep every checkpoint
    (TrainConfig, {"seed": 0}), (TrainConfig, {"seed": 2**32 - 1}),
    (TrainConfig, {"max_update": 0, "max_epoch": 0, "max_time": 0.0, "clip_norm": 0.0, "warmup": 0}),  # 0: off
    (SearchConfig, {"beam": MAX_BEAM, "nbest": MAX_BEAM, "lenpen": 0.0}),
    (ServeConfig, {"port": 0, "batch_window_ms": 0.0}),  # port 0: any free port
    (SamplingConfig, {"sampling_topk": 10**6}),  # more than the vocabulary: all of it
    (PreprocessConfig, {"min_len": 0, "max_ratio": 1e9}),
])
def test_meaningful_edge_values_are_accepted(cls, changes):
    replace(VALID[cls], **changes).validate()


def test_the_beam_is_limited_and_the_limit_named():
    with pytest.raises(NmtError, match=f"--beam must be at most {MAX_BEAM}, not 1000000"):
        SearchConfig(beam=10**6).validate()


def test_serve_refuses_a_default_beam_above_max_beam_and_a_max_beam_above_the_limit():
    with pytest.raises(NmtError, match="--beam 20 is more than --max-beam 16"):
        ServeConfig(max_beam=16).validate(beam=20)
    with pytest.raises(NmtError, match=f"--max-beam must be at most {MAX_BEAM}"):
        ServeConfig(max_beam=MAX_BEAM + 1).validate()
    ServeConfig(max_beam=MAX_BEAM).validate(beam=MAX_BEAM)


# -- the command line: what click parses reaches the dataclass ------------------------------

@pytest.mark.parametrize("args,needle", [
    (["train", "--adam-eps", "nan"], "--adam-eps must be a finite number"),
    (["translate", "--beam", str(10**6)], f"--beam must be at most {MAX_BEAM}"),
    (["preprocess", "-s", "en", "-t", "de", "--trainpref", "x", "--seed", "-1"], "--seed must be at least 0"),
])
def test_the_command_line_refuses_bad_numbers_in_one_line(tmp_path, args, needle):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "preprocess.json").write_text("{}")  # train checks the run is preprocessed first
    proc = run_nmt(*args, "-r", tmp_path, input="")
    assert_one_line_error(proc, needle)
    assert proc.stderr.startswith("nmt: error: ")


# -- checkpoints of the wrong layout -----------------------------------------------------------

TENSORS = {"w": torch.zeros(2)}
CRAFTED = {
    "a list": [TENSORS],
    "no model": {"config": {}},
    "no config": {"model": TENSORS},
    "model a list": {"model": [torch.zeros(2)], "config": {}},
    "model not tensors": {"model": {"w": [0.0, 0.0]}, "config": {}},
    "config a list": {"model": TENSORS, "config": [512]},
    "config of wrong types": {"model": TENSORS, "config": {"d_model": "big"}},
    "config out of range": {"model": TENSORS, "config": {"dropout": 2.0}},
    "train_state a list": {"model": TENSORS, "config": {}, "train_state": [10]},
    "train_state update a string": {"model": TENSORS, "config": {}, "train_state": {"update": "ten"}},
    "train_state time a bool": {"model": TENSORS, "config": {}, "train_state": {"train_time": True}},
    "train_state batching of floats": {"model": TENSORS, "config": {}, "train_state": {"batching": {"max_tokens": 1.5}}},
    "train_config a string": {"model": TENSORS, "config": {}, "train_config": "base"},
    "optimizer a tensor": {"model": TENSORS, "config": {}, "optimizer": torch.zeros(1)},
}


@pytest.mark.parametrize("layout", CRAFTED)
def test_a_checkpoint_of_the_wrong_layout_is_one_line_naming_the_file(tmp_path, layout):
    path = tmp_path / "crafted.pt"
    save_checkpoint(path, CRAFTED[layout])
    with pytest.raises(NmtError) as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert message.startswith(f"checkpoint {path} is not an nmt checkpoint (") and "\n" not in message


def test_a_checkpoint_of_the_right_layout_loads(tmp_path):
    path = tmp_path / "ok.pt"
    checkpoint = {"model": TENSORS, "config": {"d_model": 8}, "version": 1,
                  "train_state": {"update": 3, "train_time": 1, "best_loss": None, "batching": {"max_tokens": 64}},
                  "train_config": {}, "optimizer": {"state": {}, "param_groups": []}}
    save_checkpoint(path, checkpoint)
    assert load_checkpoint(path)["train_state"]["update"] == 3


@pytest.mark.parametrize("args, flag", [(["translate", "--beam", "abc"], "--beam"), (["train", "--max-tokens", "1e6"], "--max-tokens"),
                                        (["translate", "--no-such-flag"], "--no-such-flag")])
def test_a_value_the_parser_refuses_is_one_line_naming_the_flag(args, flag):
    """Unparseable values and unknown options end in one line, not click's usage box."""
    proc = run_nmt(*args)
    assert_one_line_error(proc, "nmt: error:", flag)
    assert proc.returncode == 2
