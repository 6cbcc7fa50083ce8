"""Every `nmt train` setting in one dataclass: the paper's value, the default, and why.

The CLI flags, `--help` and `config/train.json` all come from these fields. The model's
settings are nested (`TrainConfig.model`): an architecture by name and any field of
`TransformerConfig` overridden, under that field's own name (`--n-heads`, `"n_heads"` in
config/train.json and in the checkpoint's model configuration alike).
"""

from __future__ import annotations

import importlib.util
import re
import typing
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from typing import Any, ClassVar, Optional

from nmt.errors import NmtError
from nmt.model.config import VOCAB_FIELDS, TransformerConfig, check_arch
from nmt.settings import (COUNT, COUNT_OR_ALL, FRACTION, INT32_MAX, NON_NEGATIVE, POSITIVE, SEED, THREADS, Range,
                          check_ranges, setting)


DEFAULT_NOTES = {"share_all_embeddings": "Default: on when the run has one joint vocabulary."}
"""Model fields whose default comes from the run, not from the architecture."""


def _model_settings_fields() -> list[tuple[str, Any, Any]]:
    """`arch`, then every TransformerConfig field but the vocabulary sizes, each optional:
    None keeps the architecture's value. Declared once, in TransformerConfig."""
    hints = typing.get_type_hints(TransformerConfig)
    specs: list[tuple[str, Any, Any]] = [("arch", str, setting("base", "Architecture (`nmt archs`): tiny (tests), mini (4+4, d 128), small (3+3, d 256), base (paper base), big (paper big)."))]
    for f in fields(TransformerConfig):
        if f.name not in VOCAB_FIELDS:
            default = DEFAULT_NOTES.get(f.name, f"Default: the --arch's ({f.default} for base).")
            specs.append((f.name, Optional[hints[f.name]], setting(None, f"{f.metadata['help']} {default}")))
    return specs


def _overrides(self: Any) -> dict[str, Any]:
    """The TransformerConfig fields set here (the rest keep the architecture's values)."""
    return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "arch" and getattr(self, f.name) is not None}


ModelSettings = make_dataclass(
    "ModelSettings", _model_settings_fields(), namespace={"overrides": _overrides, "__module__": __name__,
                                                          "__doc__": "The model flags of `nmt train`: --arch and TransformerConfig's fields."})
MODEL_FIELDS = tuple(f.name for f in fields(ModelSettings))
"""The flags of the model panel, in TrainConfig.model."""

LEGACY_MODEL_NAMES = {"heads": "n_heads"}
"""Records written before the model settings were nested used these names."""
LEGACY_NEGATED_NAMES = {"no_epoch_checkpoints": "epoch_checkpoints", "no_progress_bar": "progress_bar"}
"""Booleans once named for what they turned off; records written then hold the old name and the opposite value."""


@dataclass
class TrainConfig:
    model: ModelSettings = field(default_factory=ModelSettings,  # type: ignore[valid-type]
                                 metadata={"help": "The model: --arch and any of its fields overridden."})
    # -- optimisation ------------------------------------------------------------------
    max_tokens: int = setting(4096, "Tokens per batch and side, padding included, per GPU/process (paper: ~25000 per side over 8 GPUs).")
    update_freq: int = setting(1, "Accumulate gradients over this many batches per update (to match the paper's batch on fewer GPUs).")
    required_seq_len_multiple: int = setting(1, "Pad every batch's source and target width to a multiple of N, and count that padding in --max-tokens (fairseq's flag). It bounds the number of tensor shapes, and so the kernels oneDNN builds and caches for bf16 on CPU, at the price of the padding (on Multi30k's short sentences 1 stayed faster).")
    required_batch_size_multiple: int = setting(1, "Trim each batch of N or more sentences to a multiple of N; the rest starts the next batch (fairseq's flag, default 8 there).")
    label_smoothing: float = setting(0.1, "Label smoothing epsilon_ls (paper 5.4: 0.1).")
    warmup: int = setting(4000, "Warmup steps of the schedule (paper 5.3: 4000); 0 = no warmup (the inverse square root decay from step 1).")
    lr_scale: float = setting(1.0, "Multiplier on the paper's lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).")
    lr: Optional[float] = setting(None, "fairseq-style peak learning rate reached at the end of warmup (inverse_sqrt); replaces the paper's formula.")
    lr_cooldown: float = setting(0.0, "Decay the rate linearly to 0 over the last FRACTION of the run, which ends at the nearer of --max-update and --max-time (the training clock): the cooldown of warmup-stable-decay schedules (Hagele et al. 2024), on top of either form above; 0 = off (the paper: the inverse square root to the end). Under --max-time the rates follow the clock, so a run stopped and resumed takes the rates of its own clock, not those of an unbroken run.")
    adam_beta1: float = setting(0.9, "Adam beta1 (paper: 0.9).")
    adam_beta2: float = setting(0.98, "Adam beta2 (paper: 0.98).")
    adam_eps: float = setting(1e-9, "Adam epsilon (paper: 1e-9).")
    weight_decay: float = setting(0.0, "Weight decay (paper: none).")
    clip_norm: float = setting(0.0, "Clip the gradient norm to this value; 0 disables (paper: no clipping).")
    seed: int = setting(1, "Seed for initialisation, dropout and the per-epoch batch order.")
    subword_sampling: bool = setting(True, "Train epoch e on sampled segmentation ((e-1) mod K)+1 when `nmt preprocess "
                                     "--subword-samples K` stored some (subword regularization: Kudo 2018, BPE-dropout); "
                                     "--no-subword-sampling trains every epoch on the deterministic one. Validation "
                                     "always uses the deterministic one.")
    max_update: int = setting(0, "Stop after this many updates; 0 = no limit (paper: 100k base, 300k big).")
    max_epoch: int = setting(0, "Stop after this many epochs; 0 = no limit.")
    max_time: float = setting(0.0, "Stop after this much training wall-clock time, validation and saving included, summed over resumes (e.g. 30m, 12h, 90s); training stops at the first update or validation that reaches it, then the final validation and save run past it, and the last line says by how much. 0 = no limit.")
    # -- validation and checkpoints ------------------------------------------------------
    validate_interval_updates: int = setting(0, "Also validate every N updates (always after each epoch); 0 = epochs only.")
    eval_bleu: bool = setting(False, "Also compute validation BLEU with beam search (beam 4, alpha 0.6) and pick checkpoint_best.pt by it.")
    save_interval_updates: int = setting(0, "Write checkpoint_{epoch}_{update}.pt every N updates; 0 = off.")
    save_interval_minutes: float = setting(10.0, "Write checkpoint_{epoch}_{update}.pt each time the training clock (validation included, summed over resumes) passes a multiple of N minutes, whatever the epoch saves do (paper: every 10 minutes, averaging the last 5 or 20); 0 = off.")
    keep_last: int = setting(5, "Keep only the last N interval checkpoints (checkpoint_{epoch}_{update}.pt, which hold the optimizer state); -1 = all. 5 is the paper's base averaging window; pass 20 for big.")
    keep_last_epochs: int = setting(-1, "Keep only the last N epoch checkpoints (checkpoint{epoch}.pt, model only: no optimizer state); -1 = all.")
    epoch_checkpoints: bool = setting(True, "Write checkpoint{epoch}.pt files at epoch ends.")
    log_interval: int = setting(100, "Write a train record to logs/train.jsonl, its line to logs/train.log and to the screen, every N updates, or after a minute of training if that comes first (slow updates); also at a launch's first update when N updates would take longer than a minute, and when training stops.")
    patience: int = setting(0, "Early stopping (fairseq's --patience): stop when --best-checkpoint-metric has not improved for N validations in a row; 0 = off. The final line and a \"stop\" record in logs/train.jsonl say so; a resume continues the count.")
    best_checkpoint_metric: str = setting("auto", "Validation metric that picks checkpoint_best.pt and drives --patience: loss (lower is better), bleu (higher is better; needs --eval-bleu), or auto (bleu with --eval-bleu, else loss).")
    tensorboard: bool = setting(False, "Write TensorBoard event files to RUN/tensorboard: train and valid loss, nll_loss, ppl, lr, gnorm, wps (target tokens/s), valid BLEU (tensorboard is the extra 'nmt\\[tensorboard]'; make install installs it).")
    tensorboard_logdir: Optional[str] = setting(None, "Write the TensorBoard event files to this folder instead of RUN/tensorboard (implies --tensorboard).")
    # -- resume and fine-tuning -----------------------------------------------------------
    restore_file: Optional[str] = setting(None, "First launch only: start from this checkpoint (model, optimizer, schedule, data position). Once checkpoint_last.pt exists, training resumes from it; if it is damaged or lost, name one of the run's own checkpoints here to continue the run from it.")
    finetune_from: Optional[str] = setting(None, "First launch only: start from these model weights with a fresh optimizer, schedule and data position; without --arch the model is the checkpoint's own (e.g. an `nmt import`ed one), with --arch it must fit the weights.")
    reset_optimizer: bool = setting(False, "First launch only, with --restore-file: start a fresh optimizer (Adam moments).")
    reset_lr_scheduler: bool = setting(False, "First launch only, with --restore-file: restart the schedule at step 1 (the offset is saved, so resumes continue it).")
    reset_dataloader: bool = setting(False, "First launch only, with --restore-file: start at the beginning of a fresh epoch order.")
    # -- devices and precision -------------------------------------------------------------
    device: str = setting("auto", "auto (all CUDA GPUs if any, else CPU), cpu or cuda.")
    threads: int = setting(0, "CPU threads for PyTorch per process; 0 = PyTorch's default.")
    amp: str = setting("auto", "Mixed precision: auto (bf16 on a GPU that supports it and on a CPU with bf16 matrix units, AVX512-BF16 or AMX; else none, the paper's fp32), bf16, fp16 (dynamic loss scaling) or none. Weights, optimizer and loss stay fp32.")
    distributed_world_size: int = setting(0, "Processes to train with; 0 = one per visible GPU, or 1 on CPU. With --device cpu, N>1 runs DDP over gloo.")
    max_skips: int = setting(20, "Stop with an error after this many updates in a row skipped for a non-finite loss or gradient.")
    min_loss_scale: float = setting(1e-4, "fp16: stop with an error when the dynamic loss scale falls below this.")
    progress_bar: bool = setting(True, "Draw a progress bar on a terminal; without it, plain log lines only.")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """From a record (config/train.json, a checkpoint's train_config) or from one flat value
        per flag (the CLI's, `flat()`): model fields at the top level go into `model`, under
        their old names too (`heads`); fields added since a record was written take their defaults.
        Old negated booleans (`no_progress_bar: true`) become today's (`progress_bar: false`)."""
        d = dict(d)
        for old, new in LEGACY_NEGATED_NAMES.items():
            if old in d:
                value = d.pop(old)
                d.setdefault(new, not value)
        model = dict(d.pop("model", None) or {})
        for name in list(d):
            key = LEGACY_MODEL_NAMES.get(name, name)
            if key in MODEL_FIELDS:
                model.setdefault(key, d.pop(name))
        known = {f.name for f in fields(cls)}
        return cls(model=ModelSettings(**{k: v for k, v in model.items() if k in MODEL_FIELDS}),
                   **{k: v for k, v in d.items() if k in known and k != "model"})

    def flat(self) -> dict[str, Any]:
        """One value per flag name: the model's fields beside the others (what the CLI and the
        resume rule compare)."""
        d = self.to_dict()
        return {**d.pop("model"), **d}

    RANGES: ClassVar[dict[str, Range]] = {
        "max_tokens": Range(8, INT32_MAX), "update_freq": POSITIVE,
        # Padding every batch to a multiple wider than any sentence only wastes the batch.
        "required_seq_len_multiple": Range(1, 1024), "required_batch_size_multiple": Range(1, 1024),
        "label_smoothing": FRACTION, "warmup": COUNT, "lr_cooldown": Range(0.0, 1.0),  # 1: the whole run
        # An Adam rate above 1 is a typo (5e4 for 5e-4); the paper's formula peaks near 1e-3.
        "lr_scale": Range(0.0, 100.0, low_open=True), "lr": Range(0.0, 1.0, low_open=True),
        "adam_beta1": FRACTION, "adam_beta2": FRACTION, "adam_eps": Range(0.0, 1.0, low_open=True),
        "weight_decay": Range(0.0, 1.0), "clip_norm": NON_NEGATIVE, "seed": SEED,
        "max_update": COUNT, "max_epoch": COUNT, "max_time": NON_NEGATIVE,
        "validate_interval_updates": COUNT, "save_interval_updates": COUNT, "save_interval_minutes": NON_NEGATIVE,
        "keep_last": COUNT_OR_ALL, "keep_last_epochs": COUNT_OR_ALL, "log_interval": POSITIVE, "patience": COUNT,
        "threads": THREADS, "distributed_world_size": THREADS, "max_skips": POSITIVE, "min_loss_scale": NON_NEGATIVE,
    }
    """The range of every numeric setting (`nmt.settings`); the model's are TransformerConfig.RANGES."""

    def validate(self) -> None:
        """Refuse settings outside their meaning (the paper's ranges), before any work: every
        number by its declared range, NaN, inf and huge values included, then the rules
        between settings."""
        check_arch(self.model.arch)
        check_ranges(self.model, TransformerConfig.RANGES)
        check_ranges(self)
        if self.amp not in ("auto", "bf16", "fp16", "none"):
            raise NmtError(f"unknown --amp {self.amp!r}; choose auto, bf16, fp16 or none")
        if self.device not in ("auto", "cpu", "cuda"):
            raise NmtError(f"unknown --device {self.device!r}; choose auto, cpu or cuda")
        if self.lr is not None and self.lr_scale != 1.0:
            raise NmtError("--lr and --lr-scale are two ways to set the rate; give only one")
        if self.lr_cooldown and not (self.max_update or self.max_time):
            raise NmtError("--lr-cooldown is a fraction of the run: give --max-update or --max-time too, or drop it")
        if (self.tensorboard or self.tensorboard_logdir) and importlib.util.find_spec("tensorboard") is None:
            raise NmtError("--tensorboard needs the tensorboard package: pip install 'nmt[tensorboard]' "
                           "(make install installs it), or drop the flag")
        if self.best_checkpoint_metric not in ("auto", "loss", "bleu"):
            raise NmtError(f"unknown --best-checkpoint-metric {self.best_checkpoint_metric!r}; choose loss, bleu or auto")
        if self.best_checkpoint_metric == "bleu" and not self.eval_bleu:
            raise NmtError("--best-checkpoint-metric bleu needs --eval-bleu (BLEU is only measured with it)")
        if self.restore_file and self.finetune_from:
            raise NmtError("--restore-file resumes a run and --finetune-from starts a new one; give only one")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def best_metric(self) -> str:
        """loss or bleu: what checkpoint_best.pt and --patience follow."""
        if self.best_checkpoint_metric == "auto":
            return "bleu" if self.eval_bleu else "loss"
        return self.best_checkpoint_metric


def parse_duration(text: str) -> float:
    """Seconds in '90', '90s', '30m', '1.5h', '2d'; a plain number is seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", str(text))
    if not m:
        raise NmtError(f"cannot read the duration {text!r}; write e.g. 90s, 30m or 12h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
