"""`nmt train`: the paper's training recipe (Section 5), top to bottom, resumable.

One explicit loop (nanoGPT style) over the policy; the mechanism of an update lives in
`nmt.train.engine.TrainEngine`, the decisions of when to validate, save and stop in
`nmt.train.policy`, and where a launch starts in `nmt.train.resume`:

    resolve the launch (resume / restore / fine-tune / fresh, and the run's recorded settings)
    for each epoch: its batches (a pure function of seed and epoch), in groups of one update
        engine.step(group) -> log -> decide (validate? save? stop?) on the training clock
        save: checkpoint_last.pt + interval/epoch names, with the log offsets of that moment

Everything that decides what happens next (model, optimizer, RNG states, epoch and position
inside it, the training clock and its save schedule, lr offset, batching settings, the length
of the logs) is in checkpoint_last.pt, so re-running the command after a crash continues exactly
and logs every update once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from nmt.train import distributed as dist_util
from nmt.train import policy as train_policy
from nmt.run.atomic import remove_leftover_temps
from nmt.data.batch_stream import BatchStream, PreparedUpdate
from nmt.data.batching import Batch, collate, make_batches, usable_indices
from nmt.run.checkpoint import CHECKPOINT_VERSION
from nmt.run.checkpoint_files import CheckpointManager
from nmt.data.token_arrays import TokenArray
from nmt.preprocess.subword_sampling import sample_for_epoch, sample_split
from nmt.train.engine import SkippedStep, TrainEngine, forward_loss
from nmt.device import cpu_bf16_units
from nmt.errors import Interrupted, NmtError
from nmt.ops.cpu_malloc import keep_freed_memory
from nmt.run.identity import IDENTITY_KEY, check_identity, checkpoint_identity, run_identity
from nmt.model.transformer import Transformer
from nmt.model.config import NMT_SPECIAL_IDS, SpecialIds, TransformerConfig, arch_of, architecture, build_config, model_size
from nmt.train.precision import Precision
from nmt.run.directory import RunDir
from nmt.run.lock import RunLock, command_line
from nmt.train.schedule import cooldown, learning_rate
from nmt.train.progress import end_of_training, fraction_done, limits_of
from nmt.run.state import TrainState
from nmt.train.config import MODEL_FIELDS, ModelSettings, TrainConfig
from nmt.train.log import LN2, TrainLogger, log_offsets, restore_logs, truncate_logs
from nmt.train.resume import (BATCHING_DEFAULTS, BATCHING_FIELDS, CONTINUING_MODES, Launch, given_from_defaults,
                               launch_record, log_offsets_to_keep, resolve_launch)


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


def model_config_for(cfg: TrainConfig, prep: dict[str, Any], finetuned: Optional[dict[str, Any]] = None) -> TransformerConfig:
    """The model the flags ask for, sized to the run's vocabulary, with its special ids.

    `finetuned`: the configuration of the checkpoint given to --finetune-from, which then
    is the model (an imported OPUS-MT model has no --arch); flags may still change what
    does not change the weights' meaning, such as dropout."""
    src_v = int(prep["vocab_sizes"][prep["source_lang"]])
    tgt_v = int(prep["vocab_sizes"][prep["target_lang"]])
    special = SpecialIds(**prep["special_ids"]) if "special_ids" in prep else NMT_SPECIAL_IDS
    overrides = cfg.model.overrides()
    if finetuned is not None:
        base = TransformerConfig.from_dict(finetuned)
        model = replace(base, **overrides, src_vocab_size=src_v, tgt_vocab_size=tgt_v, pad_id=special.pad,
                        unk_id=special.unk, bos_id=special.bos, eos_id=special.eos)
        model.validate()
        return model
    if overrides.get("share_all_embeddings") and not prep.get("joined", False):
        raise NmtError(
            "--share-all-embeddings needs one joint vocabulary, but this run directory has separate source and "
            "target vocabularies; re-run `nmt preprocess --joined` or drop --share-all-embeddings"
        )
    if overrides.get("share_all_embeddings") is None:
        overrides["share_all_embeddings"] = bool(prep.get("joined", False)) and src_v == tgt_v
    return build_config(cfg.model.arch, src_v, tgt_v, special, **overrides)


def validation_loss(model: Transformer, corpus: Corpus, max_tokens: int, device: torch.device,
                    precision: Precision, ctx: dist_util.DistContext, label_smoothing: float,
                    len_multiple: int = 1) -> dict[str, float]:
    """Smoothed loss and NLL per target token (base 2) on the whole valid set, sharded over ranks."""
    was_training = model.training
    model.eval()
    specials = (model.module if hasattr(model, "module") else model).cfg.special_ids
    batches = make_batches(corpus.src.sizes, corpus.tgt.sizes, corpus.indices, max_tokens, seed=0, epoch=0,
                           len_multiple=len_multiple)
    totals = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for ids in batches[ctx.rank :: ctx.world_size]:
            batch = collate(corpus.src, corpus.tgt, ids, len_multiple, specials).to(device)
            loss, nll = forward_loss(model, batch, label_smoothing, precision)
            totals += torch.tensor([loss.item(), nll.item(), batch.n_tgt_tokens], dtype=torch.float64)
    totals = ctx.all_reduce_sum(totals)
    model.train(was_training)
    n = max(totals[2].item(), 1.0)
    return {"loss": totals[0].item() / n / LN2, "nll_loss": totals[1].item() / n / LN2,
            "ppl": 2 ** (totals[1].item() / n / LN2), "ntokens": int(totals[2].item())}


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class TrainingClock:
    """The training clock: seconds trained before this launch plus this launch's wall time."""

    def __init__(self, already: float):
        self.already, self.start = already, time.monotonic()

    def __call__(self) -> float:
        return self.already + (time.monotonic() - self.start)


class InterruptFlag:
    """The first Ctrl-C asks training to save and stop after the current update; a second one
    restores Python's default and so stops at once. A process started with Ctrl-C ignored (a
    script's background job, as the shell starts it) keeps ignoring it, as Python itself does."""

    def __init__(self) -> None:
        self.raised = False
        self._previous: Any = None

    def __enter__(self) -> "InterruptFlag":
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.raised = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Trainer:
    """The loop of one training process (one rank): policy over a `TrainEngine`."""

    def __init__(self, run_dir: Path, cfg: TrainConfig, ctx: dist_util.DistContext, given: Optional[set[str]] = None):
        self.ctx = ctx
        self.rd = RunDir(Path(run_dir))
        self.prep = self.rd.read_record("preprocess")
        cfg.validate()
        recorded = self.rd.read_record("train") if self.rd.has_record("train") else None
        given = given if given is not None else given_from_defaults(cfg)
        self.launch: Launch = resolve_launch(self.rd.checkpoint_dir, recorded, cfg, given)
        self.cfg = cfg = self.launch.cfg
        cfg.validate()
        self.history = list((recorded or {}).get("launches", []))
        self.recorded_precision: Optional[str] = (recorded or {}).get("precision")
        self.device = ctx.device
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        if self.device.type == "cpu":
            # Adam's second moments and tiny gradients reach denormal floats, which x86 cores
            # compute up to 100x slower; flushing them to zero changes nothing measurable.
            torch.set_flush_denormal(True)
        self.malloc = keep_freed_memory() if self.device.type == "cpu" else None

        ckpt = self.launch.checkpoint
        # --finetune-from without --arch fine-tunes the checkpoint's own model (an imported one has no --arch)
        finetuned = ckpt["config"] if ckpt is not None and self.launch.mode == "finetune" and "arch" not in given else None
        self.model_cfg = model_config_for(cfg, self.prep, finetuned)
        self.model_from_checkpoint = finetuned is not None
        self.arch = arch_of(self.model_cfg)
        """The named architecture of the model's size (None for another size)."""
        self.training_stopped_at: Optional[float] = None
        """The training clock when training stopped, before the final validation and save."""
        if finetuned is not None:  # the records name every field, so a resume rebuilds this model, not --arch's
            cfg.model = ModelSettings(arch=cfg.model.arch, **{k: v for k, v in self.model_cfg.to_dict().items()
                                                              if k in MODEL_FIELDS})
        self.identity = run_identity(self.rd)
        self.notes: list[str] = list(self.launch.notes)
        if ckpt is not None:  # token ids mean pieces of one vocabulary: refuse another's model
            check_identity(checkpoint_identity(ckpt), self.identity, f"checkpoint {self.launch.checkpoint_path}",
                           warn=lambda message: self.notes.append(f"warning: {message}"))
        if ckpt is not None:
            saved = architecture(ckpt["config"])
            diff = [k for k, v in architecture(self.model_cfg.to_dict()).items() if saved.get(k) != v]
            if diff:
                differences = ", ".join(f"{k} {saved.get(k)} vs {getattr(self.model_cfg, k)}" for k in diff[:3])
                if self.launch.mode == "finetune":
                    raise NmtError(f"the weights of {self.launch.checkpoint_path} do not fit the model the flags and "
                                   f"vocabulary give ({differences}); drop --arch and the model flags to fine-tune "
                                   f"the checkpoint's own model")
                raise NmtError(f"{self.launch.checkpoint_path} is a different model from what the flags and vocabulary "
                               f"give ({differences}); use a new --run-dir, or the run's own settings")
        self.ckpts = CheckpointManager(self.rd.checkpoint_dir, cfg.keep_last, cfg.keep_last_epochs, ctx.is_main)
        self.engine = TrainEngine(
            self.model_cfg, ctx, amp=cfg.amp, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay, label_smoothing=cfg.label_smoothing, clip_norm=cfg.clip_norm,
            min_loss_scale=cfg.min_loss_scale, seed=cfg.seed, gemm_row_multiple=cfg.max_tokens,
        )
        self.model, self.precision = self.engine.model, self.engine.precision
        self.state = TrainState()
        if ckpt is not None:
            self._restore(ckpt)

        self.train_data = load_corpus(self.rd, self.prep, "train", self.model_cfg.max_positions)
        if len(self.train_data.indices) == 0:
            raise NmtError("no training pair fits the model's positions; check `nmt preprocess` output or raise --max-positions")
        # Subword regularization: one sampled segmentation per epoch (nmt.preprocess.subword_sampling)
        sampling = self.prep.get("subword_sampling")
        self.samples = int(sampling["samples"]) if sampling and cfg.subword_sampling else 0
        self.sampled_data = [load_corpus(self.rd, self.prep, sample_split(k), self.model_cfg.max_positions)
                             for k in range(1, self.samples + 1)]
        self.valid_data = (
            load_corpus(self.rd, self.prep, "valid", self.model_cfg.max_positions)
            if (self.rd.data_dir / f"valid.{self.prep['source_lang']}.idx").is_file() else None
        )
        self._check_batching()
        self._cut_logs: dict[str, bytes] = {}
        if ctx.is_main:
            self._cut_logs = truncate_logs(self.rd.log_dir, log_offsets_to_keep(self.launch, self.state.log_offsets))
        self.saved_log_offsets = log_offsets(self.rd.log_dir)
        self.saved_this_launch = False
        self.logger = TrainLogger(self.rd.log_dir, cfg.log_interval, enabled=ctx.is_main, progress_bar=cfg.progress_bar,
                                  tensorboard_dir=self._tensorboard_dir())

    # -- launch -------------------------------------------------------------------------
    def _tensorboard_dir(self) -> Optional[Path]:
        if self.cfg.tensorboard_logdir:
            return Path(self.cfg.tensorboard_logdir)
        return self.rd.root / "tensorboard" if self.cfg.tensorboard else None

    def _restore(self, ckpt: dict[str, Any]) -> None:
        """Apply the launch's checkpoint by the one resume rule (see nmt.train.resume)."""
        cfg, mode = self.cfg, self.launch.mode
        self.engine.load_model(ckpt["model"])
        if mode == "finetune":
            return
        self.state = TrainState.from_dict(ckpt.get("train_state", {}))
        first_launch = mode == "restore"
        fresh_optimizer = first_launch and cfg.reset_optimizer
        if "optimizer" in ckpt and not fresh_optimizer:
            self.engine.load_optimizer(ckpt["optimizer"])
        elif not fresh_optimizer:
            self.notes.append(f"{self.launch.checkpoint_path} holds no optimizer state (a model-only epoch "
                              f"checkpoint): Adam's moments start afresh")
        if first_launch and cfg.reset_lr_scheduler:
            self.state.lr_offset = self.state.update
        if first_launch and cfg.reset_dataloader:
            self.state.epoch += self.state.updates_in_epoch > 0
            self.state.updates_in_epoch = 0
        elif "rng" in ckpt:
            _set_rng_state(ckpt["rng"], self.device)
        self.engine.load_scaler(ckpt.get("scaler"))

    def _batching(self) -> dict[str, int]:
        """What forms an epoch's batches: the batching flags, the world size, and how many sampled
        segmentations the epochs cycle through (which one an epoch uses follows from its number)."""
        return {**{k: int(getattr(self.cfg, k)) for k in BATCHING_FIELDS}, "world_size": self.ctx.world_size,
                "segmentations": self.samples}

    def _check_batching(self) -> None:
        """Resuming with other batching settings cannot continue the epoch's list: restart it."""
        s, now = self.state, self._batching()
        if s.batching:  # fields that older checkpoints did not record had their defaults
            s.batching = {**BATCHING_DEFAULTS, **s.batching}
        if s.batching and s.batching != now and s.updates_in_epoch > 0:
            diff = ", ".join(f"{k} {s.batching.get(k)} -> {v}" for k, v in now.items() if s.batching.get(k) != v)
            self.notes.append(f"warning: batching changed ({diff}), so epoch {s.epoch} restarts from its beginning "
                              f"with the new batches ({s.updates_in_epoch} updates of it were done)")
            s.updates_in_epoch = 0
        s.batching = now

    def checkpoint_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            **self.engine.state_dict(),
            "config": self.model_cfg.to_dict(),
            "train_state": self.state.to_dict(),
            "train_config": self.cfg.to_dict(),
            "rng": _rng_state(self.device),
            IDENTITY_KEY: self.identity,
        }

    def model_only_dict(self) -> dict[str, Any]:
        """For epoch checkpoints: enough to translate, average and inspect; no optimizer."""
        return {"version": CHECKPOINT_VERSION, "model": self.model.state_dict(), "config": self.model_cfg.to_dict(),
                "train_state": self.state.to_dict(), "train_config": self.cfg.to_dict(), IDENTITY_KEY: self.identity}

    # -- the loop -----------------------------------------------------------------------
    def lr_at(self, update: int) -> float:
        """The rate of `update`: the schedule at update - lr_offset, times --lr-cooldown's factor
        at how far the run had come before this update (updates done, training clock)."""
        rate = learning_rate(update - self.state.lr_offset, self.model_cfg.d_model, self.cfg.warmup, self.cfg.lr_scale, self.cfg.lr)
        if self.cfg.lr_cooldown:
            done = fraction_done(limits_of(self.cfg), update - 1, self.state.train_time) or 0.0
            rate *= cooldown(done, self.cfg.lr_cooldown)
        return rate

    def collate(self, src: TokenArray, tgt: TokenArray, ids: np.ndarray) -> Batch:
        """One training batch as tensors, padded to --required-seq-len-multiple."""
        return collate(src, tgt, ids, self.cfg.required_seq_len_multiple, self.model_cfg.special_ids)

    def epoch_corpus(self, epoch: int) -> Corpus:
        """The segmentation epoch `epoch` trains on: sample ((epoch - 1) mod K) + 1 of the K that
        `nmt preprocess --subword-samples K` stored, else the deterministic one."""
        k = sample_for_epoch(epoch, self.samples)
        return self.sampled_data[k - 1] if k else self.train_data

    def epoch_groups(self, epoch: int) -> list[list[np.ndarray]]:
        """This epoch's batches in groups of world_size x update_freq: one group per update."""
        d = self.epoch_corpus(epoch)
        batches = make_batches(d.src.sizes, d.tgt.sizes, d.indices, self.cfg.max_tokens, self.cfg.seed, epoch,
                               len_multiple=self.cfg.required_seq_len_multiple,
                               batch_multiple=self.cfg.required_batch_size_multiple)
        per_update = self.ctx.world_size * self.cfg.update_freq
        return [batches[i : i + per_update] for i in range(0, len(batches), per_update)]

    def train_step(self, prepared: PreparedUpdate) -> Optional[dict[str, float]]:
        """One update through the engine from a batch stream's prepared update; None when it was
        skipped (non-finite)."""
        update = self.state.update + 1
        out = self.engine.step(prepared.weighted(), self.lr_at(update))
        if isinstance(out, SkippedStep):
            self.state.consecutive_skips += 1
            if self.state.consecutive_skips >= self.cfg.max_skips:
                raise NmtError(
                    f"{self.state.consecutive_skips} updates in a row had a non-finite loss or gradient "
                    f"(last at update {update}); lower the learning rate (--lr-scale/--lr), add --clip-norm, "
                    f"or use --amp bf16/none"
                )
            self.logger.skip(update, self.state.epoch, out.gnorm, out.loss_scale)
            return None
        self.state.consecutive_skips = 0
        self.state.update = update
        return out.as_dict()

    def validate(self) -> Optional[dict[str, float]]:
        if self.valid_data is None or len(self.valid_data.indices) == 0:
            return None
        metrics = validation_loss(self.model, self.valid_data, self.cfg.max_tokens, self.device, self.precision, self.ctx,
                                  self.cfg.label_smoothing, self.cfg.required_seq_len_multiple)
        if self.cfg.eval_bleu:
            from nmt.train.valid_bleu import validation_bleu

            metrics["bleu"] = validation_bleu(self.model, self.valid_data, self.prep, self.rd, self.device, self.ctx)
        s = self.state
        s.last_valid_update = s.update
        s.patience_best, s.stale_validations = train_policy.patience_count(
            metrics[self.cfg.best_metric], s.patience_best, s.stale_validations, self.cfg.best_metric == "bleu")
        return metrics

    def _is_best(self, metrics: Optional[dict[str, float]]) -> bool:
        if metrics is None:
            return False
        s = self.state
        if self.cfg.best_metric == "bleu":
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

    def save(self, decision: train_policy.Decision, finished_epoch: int, metrics: Optional[dict[str, float]]) -> None:
        full, model_only = train_policy.checkpoint_names(decision, finished_epoch, self.state.update,
                                                         self.cfg.epoch_checkpoints)
        if self._is_best(metrics):
            (model_only or full).append("checkpoint_best.pt")
        if decision.interval_save and self.cfg.save_interval_minutes > 0:
            self.state.last_interval_save_time = self.state.train_time
        if self.ctx.is_main:
            self.logger.saved(full + model_only, self.state.update)
            self.state.log_offsets = log_offsets(self.rd.log_dir)
            self.ckpts.save(self.checkpoint_dict(), full, self.model_only_dict() if model_only else None, model_only)
            self.saved_log_offsets = self.state.log_offsets
            self.saved_this_launch = True
        self.ctx.barrier()

    def _shared_clock(self, clock: TrainingClock, interrupt: InterruptFlag) -> tuple[float, bool]:
        """Rank 0's training clock and Ctrl-C, so that every rank takes the same decisions."""
        shared = self.ctx.broadcast_from_main(torch.tensor([clock(), float(interrupt.raised)], dtype=torch.float64))
        return float(shared[0]), bool(shared[1])

    def run(self) -> TrainResult:
        cfg, s, ctx = self.cfg, self.state, self.ctx
        if ctx.is_main:
            self.history.append(launch_record(self.launch, s.update, sys.argv[1:] or None))
            self.rd.write_record("train", self.train_record())
        self.logger.start(self, self.describe())
        for note in self.notes:
            self.logger.info(note)
        if self.precision.name == "bf16" and self.device.type == "cpu" and not cpu_bf16_units()[0]:
            self.logger.info("warning: this CPU has no native bf16 matrix units (AVX512-BF16/AMX), so --amp bf16 "
                             "runs slower than fp32 here; use --amp none")
        before = self.recorded_precision
        if self.launch.mode in CONTINUING_MODES and before and before != self.precision.name:
            self.logger.info(f"warning: precision {before} -> {self.precision.name} from this launch on (--amp {cfg.amp}); "
                             f"pass --amp {'none' if before == 'fp32' else before} to keep {before}")
        if self.launch.mode != "fresh":
            how = {"resume": "resuming from", "recover": "continuing from", "restore": "restoring from",
                   "finetune": "fine-tuning from"}[self.launch.mode]
            self.logger.info(f"{how} {self.launch.checkpoint_path} at update {s.update}, epoch {s.epoch} "
                             f"(+{s.updates_in_epoch} updates into it), {s.train_time / 60:.1f} min trained")
        stopped = train_policy.stop_reason(cfg, s.update, s.epoch, s.train_time, stale_validations=s.stale_validations)
        if stopped:  # the limits given now: raising one continues a finished run
            self.logger.info(f"training already finished at update {s.update} (epoch {s.epoch}); nothing to do")
            self._log_stop(stopped)
            self.logger.close()
            return TrainResult(s.update, s.epoch, s.train_time, stopped, s.best_loss)
        clock = TrainingClock(s.train_time)
        try:
            with InterruptFlag() as interrupt:
                while stopped is None:
                    stopped = self._run_epoch(clock, interrupt)
        except (OSError, KeyboardInterrupt, MemoryError):
            # A fault from outside (full disk, read-only folder, a second Ctrl-C) keeps the logs as
            # they were at the last checkpoint: the updates after it will be done, and logged,
            # again. A launch that saved nothing leaves them exactly as it found them.
            self.logger.close()
            if ctx.is_main:
                restore_logs(self.rd.log_dir, self.saved_log_offsets, {} if self.saved_this_launch else self._cut_logs)
            raise
        except BaseException:  # training's own stop (divergence, OOM advice): its records stay
            self.logger.close()
            raise
        self._log_stop(stopped)
        if stopped == "interrupted":
            self.logger.info(f"interrupted at update {s.update}: checkpoint_last.pt saved; re-run the same command to resume")
            self.logger.close()
            raise Interrupted(f"training stopped at update {s.update}, saved in checkpoint_last.pt; "
                              f"re-run the same command to resume")
        if stopped == "patience":
            self.logger.info(f"done: stopped early, valid {cfg.best_metric} has not improved for {s.stale_validations} "
                             f"validations (--patience {cfg.patience}; best {s.patience_best:.4f}) at update {s.update}, "
                             f"epoch {s.epoch}; {end_of_training(self.training_stopped_at or s.train_time, clock(), 0.0)}")
        else:
            self.logger.info(f"done: {stopped} reached at update {s.update}, epoch {s.epoch}; "
                             f"{end_of_training(self.training_stopped_at or s.train_time, clock(), cfg.max_time)}")
        self.logger.close()
        return TrainResult(s.update, s.epoch, s.train_time, stopped, s.best_loss)

    def _log_stop(self, reason: str) -> None:
        s = self.state
        details = ({"metric": self.cfg.best_metric, "best": round(s.patience_best, 4), "patience": self.cfg.patience,
                    "stale_validations": s.stale_validations} if reason == "patience" else {})
        self.logger.stop(s, reason, **details)

    def _run_epoch(self, clock: TrainingClock, interrupt: InterruptFlag) -> Optional[str]:
        """The rest of the current epoch; returns why training stopped, or None to go on."""
        s = self.state
        groups = self.epoch_groups(s.epoch)
        self.logger.epoch_start(s.epoch, len(groups), s.updates_in_epoch, s.update)
        if s.updates_in_epoch >= len(groups):  # resumed exactly at an epoch's end
            s.epoch, s.updates_in_epoch = s.epoch + 1, 0
            return None
        d = self.epoch_corpus(s.epoch)
        with BatchStream(d.src, d.tgt, groups, rank=self.ctx.rank, world_size=self.ctx.world_size,
                         device=self.device, start=s.updates_in_epoch, collate_fn=self.collate) as stream:
            return self._run_updates(stream, len(groups), clock, interrupt)

    def _run_updates(self, stream: BatchStream, n_groups: int, clock: TrainingClock, interrupt: InterruptFlag) -> Optional[str]:
        """Train on the prepared updates of one epoch, deciding after each what to do next."""
        cfg, s = self.cfg, self.state
        for prepared in stream:
            g = prepared.position
            out = self.train_step(prepared)
            s.updates_in_epoch = g + 1
            s.train_time, interrupted = self._shared_clock(clock, interrupt)
            trained = s.train_time
            epoch_end = g + 1 == n_groups
            decision = train_policy.after_update(cfg, s, epoch_end, s.train_time, interrupted)
            if out is not None:
                self.logger.train_update(s, out, last=decision.stop is not None)
            if out is None and not (decision.stop or epoch_end):
                continue
            metrics = None
            if decision.validate and s.last_valid_update != s.update:
                with self.logger.paused():
                    metrics = self.validate()
                    if metrics is not None:
                        self.logger.valid(s, metrics)
                s.train_time, interrupted = self._shared_clock(clock, interrupt)
                late = train_policy.stop_reason(cfg, s.update, s.epoch + epoch_end, s.train_time, interrupted,
                                                s.stale_validations)
                if decision.stop is None and late is not None:  # the budget ran out during validation
                    decision = train_policy.Decision(False, late != "interrupted", epoch_end, late)
            if decision.stop:  # the last interval's record, if a skipped update or a late stop left it unwritten
                self.training_stopped_at = trained
                self.logger.end_interval(s)
            finished_epoch = s.epoch
            if epoch_end:
                s.epoch, s.updates_in_epoch = s.epoch + 1, 0
            if decision.save:
                with self.logger.paused():
                    self.save(decision, finished_epoch, metrics)
            if decision.stop:
                return decision.stop
        return None

    # -- records ------------------------------------------------------------------------
    def describe(self) -> str:
        from nmt.model.transformer import count_parameters

        per_update = self.cfg.max_tokens * self.cfg.update_freq * self.ctx.world_size
        d = self.train_data
        # Named by its size: --arch is the default base in the record of a model that a checkpoint brought.
        return (
            f"model {self.arch + ': ' if self.arch else ''}{model_size(self.model_cfg)}"
            f"{' (from the checkpoint)' if self.model_from_checkpoint else ''}, "
            f"{count_parameters(self.model) / 1e6:.1f}M parameters; "
            f"{self.ctx.world_size} process(es) on {self.device.type}, precision {self.precision.name}; "
            f"at most {per_update} tokens per side per update (max_tokens {self.cfg.max_tokens} x update_freq "
            f"{self.cfg.update_freq} x world {self.ctx.world_size}); {len(d.indices)} training pairs"
            + (f", {d.n_skipped} skipped as longer than {self.model_cfg.max_positions - 1} tokens" if d.n_skipped else "")
            + (f"; subword sampling: epoch e trains on {sample_split('k')} with k = ((e-1) mod {self.samples})+1 "
               f"({self.prep['subword_sampling']['method']}, alpha {self.prep['subword_sampling']['alpha']:g})"
               if self.samples else "")
        )

    def train_record(self) -> dict[str, Any]:
        return {
            "train_config": self.cfg.to_dict(),
            "model": self.model_cfg.to_dict(),
            "world_size": self.ctx.world_size,
            "device": self.device.type,
            "precision": self.precision.name,
            "malloc": self.malloc,
            "bf16_product_rows": self.engine.row_multiple or None,
            "max_tokens_per_update": self.cfg.max_tokens * self.cfg.update_freq * self.ctx.world_size,
            "train_pairs": int(len(self.train_data.indices)),
            "skipped_long_pairs": self.train_data.n_skipped,
            "subword_samples": self.samples,
            "launches": self.history,
        }


@dataclass
class _WorkerArgs:
    """What each rank needs; device, world size and threads are the run's effective ones, which
    `dist_util.launch` reads to start the processes."""

    cfg: TrainConfig
    given: set[str]
    device: str
    distributed_world_size: int
    threads: int


def train(run_dir: str | os.PathLike, cfg: TrainConfig, given: Optional[set[str]] = None) -> TrainResult:
    """Train in `run_dir` with `cfg`, on all local GPUs (DDP) if any, resuming if possible.

    `given` names the settings the caller asked for explicitly (the CLI passes the flags on
    its command line); on a resume, only those may differ from the run's record. None means
    every field of `cfg` that differs from its default.
    """
    run_dir = Path(run_dir)
    given = given if given is not None else given_from_defaults(cfg)
    rd = RunDir(run_dir)
    rd.read_record("preprocess")  # a clear error before any process starts
    cfg.validate()
    # One writer per run directory: the process that writes (global rank 0, or the launcher of
    # local ranks) holds the lock; other torchrun ranks write nothing.
    writer = int(os.environ.get("RANK", "0")) == 0
    with RunLock(run_dir, command_line()) if writer else nullcontext():
        if writer and rd.checkpoint_dir.is_dir():
            for path in remove_leftover_temps(rd.checkpoint_dir):
                print(f"nmt: note: removed {path.name}, left by a save that was killed", file=sys.stderr)
        recorded = rd.read_record("train") if rd.has_record("train") else None
        effective = resolve_launch(rd.checkpoint_dir, recorded, cfg, given, mmap=True).cfg  # the run's devices
        args = _WorkerArgs(cfg, given, effective.device, effective.distributed_world_size, effective.threads)
        return dist_util.launch(_train_worker, run_dir, args, resume_from=rd.checkpoint_dir / "checkpoint_last.pt")


def _train_worker(ctx: dist_util.DistContext, run_dir: Path, args: _WorkerArgs) -> TrainResult:
    trainer = Trainer(run_dir, args.cfg, ctx, args.given)
    return trainer.run()
