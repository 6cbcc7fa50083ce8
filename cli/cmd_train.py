"""`nmt train`: train the Transformer in a preprocessed run directory."""

from __future__ import annotations

import inspect
import os
from typing import Any

import typer

from nmt_cli.common import RunDirOption
from nmt_cli.dataclass_options import dataclass_parameters, with_parameters

PANELS = {
    "Model": {"arch", "d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers", "dropout", "attention_dropout",
              "relu_dropout", "dropout_src", "dropout_trg", "activation", "max_positions", "share_all_embeddings", "share_decoder_input_output_embed", "pre_ln",
              "positions_layout", "output_bias"},
    "Validation and checkpoints": {"validate_interval_updates", "eval_bleu", "save_interval_updates", "save_interval_minutes",
                                   "keep_last", "keep_last_epochs", "epoch_checkpoints", "patience",
                                   "best_checkpoint_metric"},
    "Logging": {"log_interval", "progress_bar", "tensorboard", "tensorboard_logdir"},
    "Resume and fine-tuning": {"restore_file", "finetune_from", "reset_optimizer", "reset_lr_scheduler", "reset_dataloader"},
    "Devices and precision": {"device", "threads", "amp", "distributed_world_size", "max_skips", "min_loss_scale"},
}


FAIRSEQ_NAMES = {"warmup": ("--warmup-updates",), "finetune_from": ("--finetune-from-model",),
                 "keep_last": ("--keep-interval-updates",)}
"""fairseq's flags for the same settings, accepted as they are typed (docs/coming-from.md)."""


def _panel(name: str) -> str:
    return next((p for p, names in PANELS.items() if name in names), "Optimisation (Section 5)")


HELP = (
    "Train the Transformer with the paper's recipe (Section 5) in a preprocessed run directory.\n\n"
    "Label-smoothed cross entropy (0.1), Adam (0.9, 0.98, 1e-9), lrate = d_model^-0.5 * min(step^-0.5, "
    "step * warmup^-1.5), token-count batches from length-sorted buckets. Losses in logs/train.jsonl and on "
    "screen are per target token in base 2 (bits), as fairseq logs them; ppl = 2^nll_loss.\n\n"
    "Uses every visible GPU (DDP) by default and works under torchrun.\n\n"
    "Resume rule (fairseq's): when RUN/checkpoints/checkpoint_last.pt exists, training resumes from it exactly, "
    "with the settings recorded in the run (`nmt train -r RUN` needs no flags). Flags given again that differ "
    "from the record are applied where safe (limits, cadences, lr, dropout...), each named in one line; another "
    "architecture is refused. --restore-file, --finetune-from and --reset-* apply on the first launch only. "
    "Ctrl-C saves checkpoint_last.pt and exits 130; a second Ctrl-C exits at once."
)


def register(app: typer.Typer) -> None:
    from nmt.train.config import TrainConfig

    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
              inspect.Parameter("run_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RunDirOption)]
    params += dataclass_parameters(TrainConfig, panel=_panel, as_text=("max_time",), aliases=FAIRSEQ_NAMES)

    def train_command(**kwargs: Any) -> None:
        from nmt.run.directory import resolve_run_dir
        from nmt.run.lock import refuse_if_held
        from nmt.train.config import parse_duration

        ctx = kwargs.pop("ctx")
        run_dir = resolve_run_dir(kwargs.pop("run_dir"))
        if os.environ.get("RANK", "0") == "0":  # torchrun's other ranks write nothing, and rank 0 may hold it
            refuse_if_held(run_dir)  # before the slow imports below
        kwargs["max_time"] = parse_duration(kwargs["max_time"]) if kwargs.get("max_time") else 0.0
        # The flags typed on this command line: on a resume only these may change the run's record.
        given = {name for name in kwargs
                 if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") in ("COMMANDLINE", "ENVIRONMENT")}
        from nmt.train.loop import train

        train(run_dir, TrainConfig.from_dict(kwargs), given)

    app.command("train", help=HELP)(with_parameters(train_command, params))
