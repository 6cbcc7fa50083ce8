"""Every `nmt train` setting in one dataclass: the paper's value, the default, and why.

The CLI flags, `--help` and `config/train.json` all come from these fields.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from nmt.errors import NmtError


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    # -- model -------------------------------------------------------------------------
    arch: str = _f("base", "Architecture (`nmt archs`): tiny (tests), mini (4+4, d 128), small (3+3, d 256), base (paper base), big (paper big).")
    d_model: Optional[int] = _f(None, "Override d_model (paper: 512 base, 1024 big).")
    d_ff: Optional[int] = _f(None, "Override the feed-forward width d_ff (paper: 2048 base, 4096 big).")
    heads: Optional[int] = _f(None, "Override the number of attention heads h (paper: 8 base, 16 big).")
    encoder_layers: Optional[int] = _f(None, "Override the encoder depth N (paper: 6).")
    decoder_layers: Optional[int] = _f(None, "Override the decoder depth N (paper: 6).")
    dropout: Optional[float] = _f(None, "Residual dropout P_drop (paper: 0.1 base, 0.3 big En-De).")
    attention_dropout: Optional[float] = _f(None, "Dropout on attention weights (paper: none; default 0).")
    relu_dropout: Optional[float] = _f(None, "Dropout after the FFN ReLU (paper: none; default 0).")
    max_positions: Optional[int] = _f(None, "Longest sequence in subword tokens; longer training pairs are skipped and counted (default 1024).")
    share_all_embeddings: Optional[bool] = _f(None, "Share source, target and output embeddings (paper 3.4; default: on with a joint vocabulary).")
    share_decoder_input_output_embed: bool = _f(True, "Share target embeddings and the pre-softmax projection (used when not sharing all).")
    pre_ln: bool = _f(False, "LayerNorm before each sublayer (t2t's later default); the paper is post-LN.")
    # -- optimisation ------------------------------------------------------------------
    max_tokens: int = _f(4096, "Tokens per batch and side, padding included, per GPU/process (paper: ~25000 per side over 8 GPUs).")
    update_freq: int = _f(1, "Accumulate gradients over this many batches per update (to match the paper's batch on fewer GPUs).")
    required_seq_len_multiple: int = _f(1, "Pad every batch's source and target width to a multiple of N, and count that padding in --max-tokens (fairseq's flag). It bounds the number of tensor shapes, and so the kernels oneDNN builds and caches for bf16 on CPU, at the price of the padding (on Multi30k's short sentences 1 stayed faster).")
    required_batch_size_multiple: int = _f(1, "Trim each batch of N or more sentences to a multiple of N; the rest starts the next batch (fairseq's flag, default 8 there).")
    label_smoothing: float = _f(0.1, "Label smoothing epsilon_ls (paper 5.4: 0.1).")
    warmup: int = _f(4000, "Warmup steps of the schedule (paper 5.3: 4000); 0 = no warmup (the inverse square root decay from step 1).")
    lr_scale: float = _f(1.0, "Multiplier on the paper's lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).")
    lr: Optional[float] = _f(None, "fairseq-style peak learning rate reached at the end of warmup (inverse_sqrt); replaces the paper's formula.")
    adam_beta1: float = _f(0.9, "Adam beta1 (paper: 0.9).")
    adam_beta2: float = _f(0.98, "Adam beta2 (paper: 0.98).")
    adam_eps: float = _f(1e-9, "Adam epsilon (paper: 1e-9).")
    weight_decay: float = _f(0.0, "Weight decay (paper: none).")
    clip_norm: float = _f(0.0, "Clip the gradient norm to this value; 0 disables (paper: no clipping).")
    seed: int = _f(1, "Seed for initialisation, dropout and the per-epoch batch order.")
    max_update: int = _f(0, "Stop after this many updates; 0 = no limit (paper: 100k base, 300k big).")
    max_epoch: int = _f(0, "Stop after this many epochs; 0 = no limit.")
    max_time: float = _f(0.0, "Stop after this much training wall-clock time, validation and saving included, summed over resumes (e.g. 30m, 12h, 90s); the run ends within one update or one validation of it. 0 = no limit.")
    # -- validation and checkpoints ------------------------------------------------------
    validate_interval_updates: int = _f(0, "Also validate every N updates (always after each epoch); 0 = epochs only.")
    eval_bleu: bool = _f(False, "Also compute validation BLEU with beam search (beam 4, alpha 0.6) and pick checkpoint_best.pt by it.")
    save_interval_updates: int = _f(0, "Write checkpoint_{epoch}_{update}.pt every N updates; 0 = off.")
    save_interval_minutes: float = _f(10.0, "Write checkpoint_{epoch}_{update}.pt each time the training clock (validation included, summed over resumes) passes a multiple of N minutes, whatever the epoch saves do (paper: every 10 minutes, averaging the last 5 or 20); 0 = off.")
    keep_last: int = _f(5, "Keep only the last N interval checkpoints (checkpoint_{epoch}_{update}.pt, which hold the optimizer state); -1 = all. 5 is the paper's base averaging window; pass 20 for big.")
    keep_last_epochs: int = _f(-1, "Keep only the last N epoch checkpoints (checkpoint{epoch}.pt, model only: no optimizer state); -1 = all.")
    no_epoch_checkpoints: bool = _f(False, "Do not write checkpoint{epoch}.pt files.")
    log_interval: int = _f(100, "Write a train record to logs/train.jsonl, its line to logs/train.log and to the screen, every N updates.")
    patience: int = _f(0, "Early stopping (fairseq's --patience): stop when --best-checkpoint-metric has not improved for N validations in a row; 0 = off. The final line and a \"stop\" record in logs/train.jsonl say so; a resume continues the count.")
    best_checkpoint_metric: str = _f("auto", "Validation metric that picks checkpoint_best.pt and drives --patience: loss (lower is better), bleu (higher is better; needs --eval-bleu), or auto (bleu with --eval-bleu, else loss).")
    tensorboard: bool = _f(False, "Write TensorBoard event files to RUN/tensorboard: train and valid loss, nll_loss, ppl, lr, gnorm, wps (target tokens/s), valid BLEU (tensorboard is the extra 'nmt\\[tensorboard]'; make install installs it).")
    tensorboard_logdir: Optional[str] = _f(None, "Write the TensorBoard event files to this folder instead of RUN/tensorboard (implies --tensorboard).")
    # -- resume and fine-tuning -----------------------------------------------------------
    restore_file: Optional[str] = _f(None, "First launch only: start from this checkpoint (model, optimizer, schedule, data position). Once checkpoint_last.pt exists, training resumes from it.")
    finetune_from: Optional[str] = _f(None, "First launch only: start from these model weights with a fresh optimizer, schedule and data position.")
    reset_optimizer: bool = _f(False, "First launch only, with --restore-file: start a fresh optimizer (Adam moments).")
    reset_lr_scheduler: bool = _f(False, "First launch only, with --restore-file: restart the schedule at step 1 (the offset is saved, so resumes continue it).")
    reset_dataloader: bool = _f(False, "First launch only, with --restore-file: start at the beginning of a fresh epoch order.")
    # -- devices and precision -------------------------------------------------------------
    device: str = _f("auto", "auto (all CUDA GPUs if any, else CPU), cpu or cuda.")
    threads: int = _f(0, "CPU threads for PyTorch per process; 0 = PyTorch's default.")
    amp: str = _f("auto", "Mixed precision: auto (bf16 on a GPU that supports it and on a CPU with bf16 matrix units, AVX512-BF16 or AMX; else none, the paper's fp32), bf16, fp16 (dynamic loss scaling) or none. Weights, optimizer and loss stay fp32.")
    distributed_world_size: int = _f(0, "Processes to train with; 0 = one per visible GPU, or 1 on CPU. With --device cpu, N>1 runs DDP over gloo.")
    max_skips: int = _f(20, "Stop with an error after this many updates in a row skipped for a non-finite loss or gradient.")
    min_loss_scale: float = _f(1e-4, "fp16: stop with an error when the dynamic loss scale falls below this.")
    no_progress_bar: bool = _f(False, "Print plain log lines instead of a progress bar.")

    def model_overrides(self) -> dict[str, Any]:
        """Fields of TransformerConfig the user overrode."""
        return {
            "d_model": self.d_model, "d_ff": self.d_ff, "n_heads": self.heads,
            "encoder_layers": self.encoder_layers, "decoder_layers": self.decoder_layers,
            "dropout": self.dropout, "attention_dropout": self.attention_dropout,
            "relu_dropout": self.relu_dropout, "max_positions": self.max_positions,
            "share_all_embeddings": self.share_all_embeddings, "pre_ln": self.pre_ln or None,
            "share_decoder_input_output_embed": self.share_decoder_input_output_embed,
        }

    def validate(self) -> None:
        """Refuse settings outside their meaning (the paper's ranges), before any work."""
        ranges = [
            ("dropout", self.dropout, 0.0, 1.0), ("attention_dropout", self.attention_dropout, 0.0, 1.0),
            ("relu_dropout", self.relu_dropout, 0.0, 1.0), ("label_smoothing", self.label_smoothing, 0.0, 1.0),
            ("adam_beta1", self.adam_beta1, 0.0, 1.0), ("adam_beta2", self.adam_beta2, 0.0, 1.0),
        ]
        for name, value, low, high in ranges:
            if value is not None and not (low <= value < high):
                raise NmtError(f"--{name.replace('_', '-')} {value} is outside [{low:g}, {high:g})")
        for name in ("d_model", "d_ff", "heads", "encoder_layers", "decoder_layers", "max_positions"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise NmtError(f"--{name.replace('_', '-')} {value} must be positive")
        for name in ("warmup", "max_update", "max_epoch", "max_time", "validate_interval_updates",
                     "save_interval_updates", "save_interval_minutes", "weight_decay", "clip_norm", "threads",
                     "distributed_world_size"):
            if getattr(self, name) < 0:
                raise NmtError(f"--{name.replace('_', '-')} {getattr(self, name)} must be 0 or more")
        if self.adam_eps <= 0 or self.lr_scale <= 0 or (self.lr is not None and self.lr <= 0):
            raise NmtError("--adam-eps, --lr-scale and --lr must be positive")
        if self.log_interval < 1 or self.max_skips < 1:
            raise NmtError("--log-interval and --max-skips must be at least 1")
        if self.keep_last < -1 or self.keep_last_epochs < -1:
            raise NmtError("--keep-last and --keep-last-epochs take -1 (keep all) or a count")
        if self.amp not in ("auto", "bf16", "fp16", "none"):
            raise NmtError(f"unknown --amp {self.amp!r}; choose auto, bf16, fp16 or none")
        if self.device not in ("auto", "cpu", "cuda"):
            raise NmtError(f"unknown --device {self.device!r}; choose auto, cpu or cuda")
        if self.max_tokens < 8:
            raise NmtError(f"--max-tokens {self.max_tokens} is too small")
        if self.update_freq < 1:
            raise NmtError("--update-freq must be at least 1")
        for flag in ("required_seq_len_multiple", "required_batch_size_multiple"):
            if getattr(self, flag) < 1:
                raise NmtError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(self, flag)}")
        if self.lr is not None and self.lr_scale != 1.0:
            raise NmtError("--lr and --lr-scale are two ways to set the rate; give only one")
        if (self.tensorboard or self.tensorboard_logdir) and importlib.util.find_spec("tensorboard") is None:
            raise NmtError("--tensorboard needs the tensorboard package: pip install 'nmt[tensorboard]' "
                           "(make install installs it), or drop the flag")
        if self.patience < 0:
            raise NmtError(f"--patience {self.patience} must be 0 (off) or a number of validations")
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


def field_help(name: str) -> str:
    """The help text of a TrainConfig field (for the CLI)."""
    for f in fields(TrainConfig):
        if f.name == name:
            return f.metadata["help"]
    raise KeyError(name)


def field_default(name: str) -> Any:
    for f in fields(TrainConfig):
        if f.name == name:
            return f.default
    raise KeyError(name)


def parse_duration(text: str) -> float:
    """Seconds in '90', '90s', '30m', '1.5h', '2d'; a plain number is seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", str(text))
    if not m:
        raise NmtError(f"cannot read the duration {text!r}; write e.g. 90s, 30m or 12h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
