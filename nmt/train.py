"""`nmt train`: the paper's training recipe (Section 5), top to bottom, resumable.

One explicit loop (nanoGPT style): build the model from the run directory's vocabulary, form
token-count batches per epoch, accumulate `update_freq` batches per update (per process under
DDP), step Adam on the paper's schedule, log, validate and checkpoint. Everything that decides
what happens next (model, optimizer, RNG states, epoch and position inside it, wall time) is in
the checkpoint, so re-running the same command after a crash continues exactly.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from nmt import distributed as dist_util
from nmt.batching import Batch, collate, make_batches, usable_indices
from nmt.checkpoint import CHECKPOINT_VERSION, load_checkpoint, save_checkpoint
from nmt.checkpoints_dir import CheckpointManager
from nmt.data import TokenArray
from nmt.errors import NmtError
from nmt.loss import label_smoothed_nll_loss
from nmt.model import Transformer, TransformerConfig, build_config
from nmt.precision import Precision
from nmt.rundir import RunDir
from nmt.schedule import learning_rate
from nmt.train_config import TrainConfig
from nmt.train_log import TrainLogger

LN2 = math.log(2.0)


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint as plain data."""

    epoch: int = 1
    """Current epoch (1-based)."""
    updates_in_epoch: int = 0
    """Updates already done in the current epoch; resuming skips their batches."""
    update: int = 0
    train_time: float = 0.0
    """Training wall-clock seconds summed over all sessions (for --max-time)."""
    best_loss: Optional[float] = None
    best_bleu: Optional[float] = None
    consecutive_skips: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainState":
        s = cls()
        for k, v in d.items():
            if hasattr(s, k):
                setattr(s, k, v)
        return s


@dataclass
class Corpus:
    """One split's two sides and the pairs the model can take."""

    src: TokenArray
    tgt: TokenArray
    indices: np.ndarray
    n_skipped: int


@dataclass
class TrainResult:
    update: int
    epoch: int
    train_time: float
    stopped_by: str
    best_loss: Optional[float] = None
    checkpoints: list[str] = field(default_factory=list)


def load_corpus(rd: RunDir, prep: dict[str, Any], split: str, max_positions: int) -> Corpus:
    src = TokenArray(rd.data_dir, split, prep["source_lang"], prep["dtype"])
    tgt = TokenArray(rd.data_dir, split, prep["target_lang"], prep["dtype"])
    if len(src) != len(tgt):
        raise NmtError(f"{split} data in {rd.data_dir} is inconsistent ({len(src)} vs {len(tgt)} sentences); re-run `nmt preprocess --force`")
    indices, skipped = usable_indices(src.sizes, tgt.sizes, max_positions)
    return Corpus(src, tgt, indices, skipped)


def model_config_for(cfg: TrainConfig, prep: dict[str, Any]) -> TransformerConfig:
    """The model the flags ask for, sized to the run's vocabulary."""
    src_v = int(prep["vocab_sizes"][prep["source_lang"]])
    tgt_v = int(prep["vocab_sizes"][prep["target_lang"]])
    overrides = cfg.model_overrides()
    if overrides["share_all_embeddings"] and not prep.get("joined", False):
        raise NmtError(
            "--share-all-embeddings needs one joint vocabulary, but this run directory has separate source and "
            "target vocabularies; re-run `nmt preprocess --joined` or drop --share-all-embeddings"
        )
    if overrides["share_all_embeddings"] is None:
        overrides["share_all_embeddings"] = bool(prep.get("joined", False)) and src_v == tgt_v
    return build_config(cfg.arch, src_v, tgt_v, **overrides)


def validation_loss(model: Transformer, corpus: Corpus, max_tokens: int, device: torch.device,
                    precision: Precision, ctx: dist_util.DistContext, label_smoothing: float) -> dict[str, float]:
    """Smoothed loss and NLL per target token (base 2) on the whole valid set, sharded over ranks."""
    was_training = model.training
    model.eval()
    batches = make_batches(corpus.src.sizes, corpus.tgt.sizes, corpus.indices, max_tokens, seed=0, epoch=0)
    totals = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for ids in batches[ctx.rank :: ctx.world_size]:
            batch = collate(corpus.src, corpus.tgt, ids).to(device)
            loss, nll = forward_loss(model, batch, label_smoothing, precision)
            totals += torch.tensor([loss.item(), nll.item(), batch.n_tgt_tokens], dtype=torch.float64)
    totals = ctx.all_reduce_sum(totals)
    model.train(was_training)
    n = max(totals[2].item(), 1.0)
    return {"loss": totals[0].item() / n / LN2, "nll_loss": totals[1].item() / n / LN2,
            "ppl": 2 ** (totals[1].item() / n / LN2), "ntokens": int(totals[2].item())}


def forward_loss(model: torch.nn.Module, batch: Batch, label_smoothing: float, precision: Precision) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, NLL sum) in nats; the projection runs on non-pad positions only."""
    with precision.autocast():
        core: Transformer = model.module if hasattr(model, "module") else model
        if model is core:
            hidden = core.decode_hidden(batch.prev, core.encode(batch.src))
        else:  # DDP: go through forward so gradients are synchronised
            hidden = model(batch.src, batch.prev, return_hidden=True)
        mask = batch.target.ne(0)
        logits = core.project(hidden[mask])  # (N, V)
        return label_smoothed_nll_loss(logits, batch.target[mask], label_smoothing)


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class Trainer:
    """Owns the model, optimizer and state of one training process (one rank)."""

    def __init__(self, run_dir: Path, cfg: TrainConfig, ctx: dist_util.DistContext):
        cfg.validate()
        self.cfg, self.ctx = cfg, ctx
        self.rd = RunDir(Path(run_dir))
        self.prep = self.rd.read_record("preprocess")
        self.device = ctx.device
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        if self.device.type == "cpu":
            # Adam's second moments and tiny gradients reach denormal floats, which x86 cores
            # compute up to 100x slower; flushing them to zero changes nothing measurable.
            torch.set_flush_denormal(True)
        self.precision = Precision.create(cfg.amp, self.device, cfg.min_loss_scale)

        self.model_cfg = model_config_for(cfg, self.prep)
        self.ckpts = CheckpointManager(self.rd.checkpoint_dir, cfg.keep_last, cfg.keep_last_epochs, ctx.is_main)
        resume = self._find_resume_checkpoint()
        if resume is not None:
            saved_cfg = TransformerConfig.from_dict(resume["config"])
            if cfg.finetune_from is None and saved_cfg != self.model_cfg:
                diff = [k for k, v in self.model_cfg.to_dict().items() if saved_cfg.to_dict().get(k) != v]
                raise NmtError(
                    f"the run directory's checkpoint is a different model ({', '.join(diff)} differ); "
                    f"use a new --run-dir, or the same model flags to resume"
                )
        torch.manual_seed(cfg.seed)
        self.model = Transformer(self.model_cfg).to(self.device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=0.0, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay, fused=True,
        )
        self.state = TrainState()
        if resume is not None:
            self._restore(resume)
            self.resumed_from = resume.get("_path")
        self.ddp_model = ctx.wrap(self.model)

        self.train_data = load_corpus(self.rd, self.prep, "train", self.model_cfg.max_positions)
        if len(self.train_data.indices) == 0:
            raise NmtError("no training pair fits the model's positions; check `nmt preprocess` output or raise --max-positions")
        self.valid_data = (
            load_corpus(self.rd, self.prep, "valid", self.model_cfg.max_positions)
            if (self.rd.data_dir / f"valid.{self.prep['source_lang']}.idx").is_file() else None
        )
        self.logger = TrainLogger(self.rd.log_dir, cfg.log_interval, enabled=ctx.is_main, progress_bar=not cfg.no_progress_bar)

    # -- resume -------------------------------------------------------------------------
    def _find_resume_checkpoint(self) -> Optional[dict[str, Any]]:
        cfg = self.cfg
        if cfg.finetune_from:
            ckpt = load_checkpoint(cfg.finetune_from)
            ckpt["_path"] = str(cfg.finetune_from)
            return ckpt
        path = Path(cfg.restore_file) if cfg.restore_file else self.rd.checkpoint_dir / "checkpoint_last.pt"
        if not path.is_file():
            if cfg.restore_file:
                raise NmtError(f"--restore-file {path} does not exist")
            return None
        try:
            ckpt = load_checkpoint(path)
            ckpt["_path"] = str(path)
            return ckpt
        except NmtError as e:
            previous = self.ckpts.newest_interval_or_epoch()
            hint = (f"resume from the previous one with --restore-file {previous}" if previous
                    else "move it away to start afresh")
            raise NmtError(f"{e}; it was not replaced: {hint}") from None

    def _restore(self, ckpt: dict[str, Any]) -> None:
        cfg = self.cfg
        self.model.load_state_dict(ckpt["model"])
        if cfg.finetune_from:
            return
        self.state = TrainState.from_dict(ckpt.get("train_state", {}))
        if not cfg.reset_optimizer and "optimizer" in ckpt:
            self.optimizer.load_state_dict(ckpt["optimizer"])
        if cfg.reset_lr_scheduler:
            self.lr_offset = self.state.update
        if cfg.reset_dataloader:
            self.state.epoch, self.state.updates_in_epoch = self.state.epoch + (self.state.updates_in_epoch > 0), 0
        if "rng" in ckpt and not cfg.reset_dataloader:
            _set_rng_state(ckpt["rng"], self.device)
        if "scaler" in ckpt:
            self.precision.load_state_dict(ckpt["scaler"])

    lr_offset: int = 0
    resumed_from: Optional[str] = None

    def checkpoint_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "model": self.model.state_dict(),
            "config": self.model_cfg.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train_state": self.state.to_dict(),
            "train_config": self.cfg.to_dict(),
            "rng": _rng_state(self.device),
            "scaler": self.precision.state_dict(),
        }

    # -- the loop -----------------------------------------------------------------------
    def lr_at(self, update: int) -> float:
        return learning_rate(update - self.lr_offset, self.model_cfg.d_model, self.cfg.warmup, self.cfg.lr_scale, self.cfg.lr)

    def limits_reached(self) -> Optional[str]:
        cfg, s = self.cfg, self.state
        if cfg.max_update and s.update >= cfg.max_update:
            return "max_update"
        if cfg.max_epoch and s.epoch > cfg.max_epoch:
            return "max_epoch"
        if cfg.max_time and s.train_time >= cfg.max_time:
            return "max_time"
        return None

    def epoch_groups(self, epoch: int) -> list[list[np.ndarray]]:
        """This epoch's batches in groups of world_size x update_freq: one group per update."""
        d = self.train_data
        batches = make_batches(d.src.sizes, d.tgt.sizes, d.indices, self.cfg.max_tokens, self.cfg.seed, epoch)
        per_update = self.ctx.world_size * self.cfg.update_freq
        return [batches[i : i + per_update] for i in range(0, len(batches), per_update)]

    def train_step(self, group: list[np.ndarray]) -> Optional[dict[str, float]]:
        """One update from a group of batches; this rank takes every world_size-th batch.

        Gradients are sums over tokens divided by the update's total target tokens across all
        ranks, so N processes equal one process with N times the update frequency.
        """
        ctx, cfg = self.ctx, self.cfg
        mine = group[ctx.rank :: ctx.world_size]
        n_micro = -(-len(group) // ctx.world_size)  # every rank runs the same number of micro-steps
        batches = [collate(self.train_data.src, self.train_data.tgt, ids) for ids in mine]
        local = torch.tensor([sum(b.n_tgt_tokens for b in batches), sum(b.n_src_tokens for b in batches),
                              sum(b.n_sentences for b in batches)], dtype=torch.float64)
        totals = ctx.all_reduce_sum(local.clone())
        tgt_tokens = totals[0].item()
        update = self.state.update + 1
        lr = self.lr_at(update)
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        self.model.train()
        loss_sum = nll_sum = 0.0
        for i in range(n_micro):
            weight = 1.0
            if i < len(batches):
                batch = batches[i]
            else:  # dummy micro-step keeps DDP's collectives in step on every rank
                batch, weight = collate(self.train_data.src, self.train_data.tgt, group[0]), 0.0
            batch = batch.to(self.device)
            sync = nullcontext() if i == n_micro - 1 else ctx.no_sync(self.ddp_model)
            try:
                with sync:
                    loss, nll = forward_loss(self.ddp_model, batch, cfg.label_smoothing, self.precision)
                    scaled = loss * (weight * ctx.world_size / tgt_tokens)
                    self.precision.backward(scaled)
            except torch.OutOfMemoryError:
                # Skipping on one rank would leave the others waiting in the all-reduce
                # (fairseq#810), so the whole job stops, checkpoints intact, with advice.
                raise NmtError(
                    f"out of memory on rank {ctx.rank} at update {update} with a batch of {batch.n_sentences} "
                    f"sentences ({batch.n_src_tokens}+{batch.n_tgt_tokens} tokens); lower --max-tokens (raise "
                    f"--update-freq to keep the batch), then re-run to resume from checkpoint_last.pt"
                ) from None
            if weight:
                loss_sum += loss.item()
                nll_sum += nll.item()
        gnorm, ok = self.precision.unscale_and_clip(self.optimizer, self.model.parameters(), cfg.clip_norm)
        if not ok:
            self.optimizer.zero_grad(set_to_none=True)
            self.precision.update(skipped=True)
            self.state.consecutive_skips += 1
            if self.state.consecutive_skips >= cfg.max_skips:
                raise NmtError(
                    f"{self.state.consecutive_skips} updates in a row had a non-finite loss or gradient "
                    f"(last at update {update}); lower the learning rate (--lr-scale/--lr), add --clip-norm, "
                    f"or use --amp bf16/none"
                )
            self.logger.skip(update, self.state.epoch, gnorm, self.precision.scale_value())
            return None
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self.state.consecutive_skips = 0
        self.state.update = update
        stats = ctx.all_reduce_sum(torch.tensor([loss_sum, nll_sum], dtype=torch.float64))
        return {"loss_sum": stats[0].item(), "nll_sum": stats[1].item(), "ntokens": tgt_tokens,
                "src_tokens": totals[1].item(), "nsentences": totals[2].item(), "lr": lr, "gnorm": gnorm}

    def validate(self) -> Optional[dict[str, float]]:
        if self.valid_data is None or len(self.valid_data.indices) == 0:
            return None
        metrics = validation_loss(self.model, self.valid_data, self.cfg.max_tokens, self.device, self.precision, self.ctx,
                                   self.cfg.label_smoothing)
        if self.cfg.eval_bleu:
            from nmt.valid_bleu import validation_bleu

            metrics["bleu"] = validation_bleu(self.model, self.valid_data, self.prep, self.rd, self.device, self.ctx)
        return metrics

    def _is_best(self, metrics: Optional[dict[str, float]]) -> bool:
        if metrics is None:
            return False
        s = self.state
        if self.cfg.eval_bleu and "bleu" in metrics:
            if s.best_bleu is None or metrics["bleu"] > s.best_bleu:
                s.best_bleu = metrics["bleu"]
                if s.best_loss is None or metrics["loss"] < s.best_loss:
                    s.best_loss = metrics["loss"]
                return True
            return False
        if s.best_loss is None or metrics["loss"] < s.best_loss:
            s.best_loss = metrics["loss"]
            return True
        return False

    def save(self, names: list[str], metrics: Optional[dict[str, float]]) -> None:
        best = self._is_best(metrics)
        if best:
            names = names + ["checkpoint_best.pt"]
        if self.ctx.is_main:
            self.ckpts.save(self.checkpoint_dict(), names)
            self.logger.saved(names, self.state.update)
        self.ctx.barrier()

    def run(self) -> TrainResult:
        cfg, s, ctx = self.cfg, self.state, self.ctx
        if ctx.is_main:
            self.rd.write_record("train", self.train_record())
        self.logger.start(self, self.describe())
        if self.precision.name == "bf16" and self.device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            self.logger.info("warning: this CPU has no native bf16 matrix units (AVX512-BF16/AMX), so --amp bf16 "
                             "runs slower than fp32 here; use --amp none")
        if self.resumed_from:
            how = "fine-tuning from" if cfg.finetune_from else "resuming from"
            self.logger.info(f"{how} {self.resumed_from} at update {s.update}, epoch {s.epoch} "
                             f"(+{s.updates_in_epoch} updates into it), {s.train_time / 60:.1f} min trained")
        stopped = self.limits_reached()  # the limits given now: raising one continues a finished run
        if stopped:
            self.logger.info(f"training already finished at update {s.update} (epoch {s.epoch}); nothing to do")
            self.logger.close()
            return TrainResult(s.update, s.epoch, s.train_time, stopped, s.best_loss)
        session_start = time.monotonic()
        time_base = s.train_time
        last_interval_save = time.monotonic()
        while stopped is None:
            groups = self.epoch_groups(s.epoch)
            self.logger.epoch_start(s.epoch, len(groups), s.updates_in_epoch)
            for g in range(s.updates_in_epoch, len(groups)):
                out = self.train_step(groups[g])
                s.train_time = time_base + (time.monotonic() - session_start)
                if out is None:
                    continue
                s.updates_in_epoch = g + 1
                self.logger.train_update(s, out)
                # stop and save decisions come from rank 0's clock so all ranks agree
                flags = torch.tensor([
                    float(cfg.max_time > 0 and s.train_time >= cfg.max_time),
                    float(cfg.save_interval_minutes > 0 and time.monotonic() - last_interval_save >= cfg.save_interval_minutes * 60),
                ])
                flags = ctx.broadcast_from_main(flags)
                time_up, minute_save = bool(flags[0]), bool(flags[1])
                validate_now = cfg.validate_interval_updates and s.update % cfg.validate_interval_updates == 0
                save_now = (cfg.save_interval_updates and s.update % cfg.save_interval_updates == 0) or minute_save
                metrics = self.validate() if validate_now else None
                if metrics is not None:
                    self.logger.valid(s, metrics)
                if cfg.max_update and s.update >= cfg.max_update:
                    stopped = "max_update"
                elif time_up:
                    stopped = "max_time"
                if stopped and metrics is None:  # always end with a validation, as fairseq does
                    metrics = self.validate()
                    if metrics is not None:
                        self.logger.valid(s, metrics)
                if save_now or metrics is not None or stopped:
                    last_interval_save = time.monotonic()
                    self.save([f"checkpoint_{s.epoch}_{s.update}.pt", "checkpoint_last.pt"], metrics)
                if stopped:
                    break
            self.logger.epoch_end()
            if stopped:
                break
            # end of epoch: validate and checkpoint as fairseq does
            metrics = self.validate()
            if metrics is not None:
                self.logger.valid(s, metrics)
            finished_epoch = s.epoch
            s.epoch, s.updates_in_epoch = s.epoch + 1, 0
            stopped = self.limits_reached()
            names = ["checkpoint_last.pt"] if cfg.no_epoch_checkpoints else [f"checkpoint{finished_epoch}.pt", "checkpoint_last.pt"]
            self.save(names, metrics)
            last_interval_save = time.monotonic()
        self.logger.info(f"done: {stopped} reached at update {s.update}, epoch {s.epoch}, "
                         f"{s.train_time / 60:.1f} min of training")
        self.logger.close()
        return TrainResult(s.update, s.epoch, s.train_time, stopped, s.best_loss)

    # -- records ------------------------------------------------------------------------
    def describe(self) -> str:
        from nmt.model import count_parameters

        per_update = self.cfg.max_tokens * self.cfg.update_freq * self.ctx.world_size
        d = self.train_data
        return (
            f"model {self.cfg.arch}: {count_parameters(self.model) / 1e6:.1f}M parameters, "
            f"d_model {self.model_cfg.d_model}, {self.model_cfg.encoder_layers}+{self.model_cfg.decoder_layers} layers; "
            f"{self.ctx.world_size} process(es) on {self.device.type}, precision {self.precision.name}; "
            f"at most {per_update} tokens per side per update (max_tokens {self.cfg.max_tokens} x update_freq "
            f"{self.cfg.update_freq} x world {self.ctx.world_size}); {len(d.indices)} training pairs"
            + (f", {d.n_skipped} skipped as longer than {self.model_cfg.max_positions - 1} tokens" if d.n_skipped else "")
        )

    def train_record(self) -> dict[str, Any]:
        return {
            "train_config": self.cfg.to_dict(),
            "model": self.model_cfg.to_dict(),
            "world_size": self.ctx.world_size,
            "device": self.device.type,
            "precision": self.precision.name,
            "max_tokens_per_update": self.cfg.max_tokens * self.cfg.update_freq * self.ctx.world_size,
            "train_pairs": int(len(self.train_data.indices)),
            "skipped_long_pairs": self.train_data.n_skipped,
        }


def train(run_dir: str | os.PathLike, cfg: TrainConfig) -> TrainResult:
    """Train in `run_dir` with `cfg`, on all local GPUs (DDP) if any, resuming if possible."""
    return dist_util.launch(_train_worker, Path(run_dir), cfg)


def _train_worker(ctx: dist_util.DistContext, run_dir: Path, cfg: TrainConfig) -> TrainResult:
    trainer = Trainer(run_dir, cfg, ctx)
    return trainer.run()
