"""The model's settings are one dataclass (TransformerConfig), nested in the training settings,
with one name per field in flags, records and checkpoints; records written before still load."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch

from nmt.errors import NmtError
from nmt.model.config import VOCAB_FIELDS, TransformerConfig
from nmt.train.config import ModelSettings, TrainConfig
from nmt.train.resume import merge_settings
from nmt_cli.dataclass_options import dataclass_parameters

MODEL_NAMES = [f.name for f in fields(TransformerConfig) if f.name not in VOCAB_FIELDS]

OLD_FLAT_RECORD = {  # config/train.json's train_config as runs wrote it before the nesting
    "arch": "tiny", "d_model": None, "d_ff": None, "heads": 2, "encoder_layers": None, "decoder_layers": None,
    "dropout": 0.2, "attention_dropout": None, "relu_dropout": None, "max_positions": None,
    "share_all_embeddings": None, "share_decoder_input_output_embed": True, "pre_ln": False,
    "max_tokens": 192, "lr": 0.002, "warmup": 7,
}


def test_every_model_field_is_a_train_flag_under_its_own_name():
    flags = {p.name for p in dataclass_parameters(TrainConfig)}
    assert set(MODEL_NAMES) | {"arch"} <= flags
    assert "heads" not in flags and "model" not in flags


def test_flags_nest_into_the_model_settings_and_override_only_what_was_set():
    cfg = TrainConfig.from_dict({**TrainConfig().flat(), "arch": "small", "n_heads": 2, "max_tokens": 512})
    assert cfg.model.arch == "small" and cfg.max_tokens == 512
    assert cfg.model.overrides() == {"n_heads": 2}


def test_old_flat_records_load_into_the_nested_model_settings():
    cfg = TrainConfig.from_dict(OLD_FLAT_RECORD)
    assert cfg.model.arch == "tiny" and cfg.model.n_heads == 2 and cfg.model.dropout == 0.2
    assert cfg.max_tokens == 192 and cfg.warmup == 7
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_old_records_with_the_negated_booleans_load_inverted():
    """`no_progress_bar` / `no_epoch_checkpoints` (records before the booleans were named for
    what they turn on) load as `progress_bar` / `epoch_checkpoints` with the opposite value."""
    cfg = TrainConfig.from_dict({**OLD_FLAT_RECORD, "no_progress_bar": True, "no_epoch_checkpoints": True})
    assert cfg.progress_bar is False and cfg.epoch_checkpoints is False
    cfg = TrainConfig.from_dict({**OLD_FLAT_RECORD, "no_progress_bar": False, "no_epoch_checkpoints": False})
    assert cfg.progress_bar is True and cfg.epoch_checkpoints is True
    record = cfg.to_dict()
    assert "no_progress_bar" not in record and TrainConfig.from_dict(record) == cfg
    assert TrainConfig().progress_bar is True and TrainConfig().epoch_checkpoints is True


def test_no_progress_bar_and_no_epoch_checkpoints_flags_still_turn_them_off():
    import typer
    from typer.testing import CliRunner

    from nmt_cli.dataclass_options import with_parameters

    seen: dict = {}
    app = typer.Typer()
    app.command()(with_parameters(lambda **kwargs: seen.update(kwargs), dataclass_parameters(TrainConfig, as_text=("max_time",))))
    for argv, expected in (([], True), (["--no-progress-bar", "--no-epoch-checkpoints"], False),
                           (["--progress-bar", "--epoch-checkpoints"], True)):
        seen.clear()
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        assert (seen["progress_bar"], seen["epoch_checkpoints"]) == (expected, expected)


def test_fairseqs_flag_names_set_the_same_settings():
    """A fairseq user's `--warmup-updates 4000 --keep-interval-updates 20 --finetune-from-model X`."""
    import typer
    from typer.testing import CliRunner

    from nmt_cli.cmd_train import FAIRSEQ_NAMES
    from nmt_cli.dataclass_options import with_parameters

    seen: dict = {}
    app = typer.Typer()
    app.command()(with_parameters(lambda **kwargs: seen.update(kwargs),
                                  dataclass_parameters(TrainConfig, as_text=("max_time",), aliases=FAIRSEQ_NAMES)))
    result = CliRunner().invoke(app, ["--warmup-updates", "123", "--keep-interval-updates", "20",
                                      "--finetune-from-model", "x.pt", "--max-epoch", "3"])
    assert result.exit_code == 0, result.output
    assert (seen["warmup"], seen["keep_last"], seen["finetune_from"], seen["max_epoch"]) == (123, 20, "x.pt", 3)


def test_a_resume_of_an_old_run_refuses_another_model_by_the_new_flag_name():
    recorded = TrainConfig.from_dict(OLD_FLAT_RECORD)
    asked = TrainConfig(model=ModelSettings(arch="tiny", n_heads=4))
    with pytest.raises(NmtError, match="--n-heads 4 asks for a different model"):
        merge_settings(recorded, asked, {"n_heads"}, resuming=True)
    changed, notes, changes = merge_settings(recorded, TrainConfig(model=ModelSettings(dropout=0.3)), {"dropout"}, resuming=True)
    assert changed.model.dropout == 0.3 and changed.model.n_heads == 2 and changes == {"dropout": [0.2, 0.3]}


def test_the_run_records_and_the_checkpoint_name_the_model_fields_alike(trained_tiny_run):
    record = json.loads((trained_tiny_run / "config/train.json").read_text())["train_config"]
    assert set(record["model"]) == set(MODEL_NAMES) | {"arch"} and record["model"]["arch"] == "tiny"
    checkpoint = torch.load(trained_tiny_run / "checkpoints/checkpoint_last.pt", weights_only=True)
    assert set(checkpoint["train_config"]["model"]) == set(record["model"])
    assert set(MODEL_NAMES) <= set(checkpoint["config"])


def test_log_lines_show_the_lr_to_4_significant_digits_and_train_jsonl_keeps_the_float(tmp_path, capsys):
    from types import SimpleNamespace

    from nmt.train.log import TrainLogger

    lr = 512**-0.5 * 4321**-0.5  # the paper's rate after warmup: 0.0006723151323010935
    logger = TrainLogger(tmp_path, log_interval=1, progress_bar=False)
    logger.device = torch.device("cpu")
    sums = {"loss_sum": 10.0, "nll_sum": 9.0, "ntokens": 5.0, "src_tokens": 5.0, "nsentences": 1.0, "gnorm": 1.0}
    logger.train_update(SimpleNamespace(epoch=1, update=4321, train_time=1.0), {**sums, "lr": lr})
    logger.close()
    assert "| lr 0.0006723 |" in (tmp_path / "train.log").read_text() and "| lr 0.0006723 |" in capsys.readouterr().err
    assert json.loads((tmp_path / "train.jsonl").read_text())["lr"] == lr
