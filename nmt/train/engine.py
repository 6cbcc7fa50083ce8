"""The mechanism of training: one update from given batches, nothing about *when*.

`TrainEngine` owns the model, the optimizer (Adam, Section 5.3), the precision policy and the
DDP wrapper, as fairseq's `Trainer` does. It has no clock, writes no file and logs nothing: the
loop in `nmt.train.loop` decides when to validate, save and stop, and calls `step` with the batches
of one update. That split lets each half be tested alone (tests/test_engine.py runs the engine
in-process).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from nmt.train import distributed as dist_util
from nmt.data.batching import Batch
from nmt.errors import NmtError
from nmt.train.loss import ProjectedLogits, label_smoothed_nll_loss
from nmt.model.transformer import Transformer
from nmt.ops import optimize_for
from nmt.model.config import PAD_ID, TransformerConfig
from nmt.train.precision import Precision


@dataclass
class StepStats:
    """What one update did, summed over every rank (losses in nats)."""

    loss_sum: float
    nll_sum: float
    ntokens: float
    src_tokens: float
    nsentences: float
    lr: float
    gnorm: float

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class SkippedStep:
    """An update dropped for a non-finite loss or gradient (fp16 overflow, divergence)."""

    gnorm: float
    loss_scale: Optional[float]


def forward_loss(model: torch.nn.Module, batch: Batch, label_smoothing: float, precision: Precision,
                 row_multiple: int = 0) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, NLL sum) in nats; the projection runs on non-pad positions only,
    a chunk of rows at a time inside the loss (`ProjectedLogits`): the logits are never whole.
    `row_multiple`: the layers' bucketed bf16 rows (`nmt.ops.optimize_for`), which the loss's chunks match."""
    with precision.autocast():
        core: Transformer = model.module if hasattr(model, "module") else model
        if model is core:
            hidden = core.decode_hidden(batch.prev, core.encode(batch.src))
        else:  # DDP: go through forward so gradients are synchronised
            hidden = model(batch.src, batch.prev, return_hidden=True)
    rows = target_positions(batch, core.cfg.pad_id)
    weight = core.output_weight
    # Products in the autocast dtype; the loss reads the logits in fp32 whatever that is, so
    # the ranking of probabilities and the smoothed sum are never rounded to bf16/fp16.
    logits = ProjectedLogits(hidden.flatten(0, 1).index_select(0, rows), weight, precision.dtype or weight.dtype,
                             row_multiple, core.output_bias)
    return label_smoothed_nll_loss(logits, batch.target.flatten().index_select(0, rows), label_smoothing)


def target_positions(batch: Batch, pad_id: int = PAD_ID) -> Tensor:
    """Flat indices of the non-pad target positions, in order, without waiting for a GPU.

    `hidden[target != pad]` would have to learn how many positions there are from the device
    (a host synchronisation per micro-step); the batch already knows (`n_tgt_tokens`)."""
    return batch.target.ne(pad_id).flatten().nonzero_static(size=batch.n_tgt_tokens).squeeze(1)


class TrainEngine:
    """Model, optimizer, precision and DDP wrapper of one rank; `step` performs one update."""

    def __init__(self, model_cfg: TransformerConfig, ctx: dist_util.DistContext, *, amp: str = "none",
                 betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9, weight_decay: float = 0.0,
                 label_smoothing: float = 0.1, clip_norm: float = 0.0, min_loss_scale: float = 1e-4, seed: int = 1,
                 gemm_row_multiple: int = 0):
        """`gemm_row_multiple`: in bf16 on CPU, the layers' products pad a batch's rows to a
        multiple of this (the trainer passes --max-tokens, which bounds a batch's rows), so
        that oneDNN builds its kernels once, not per batch (`nmt.ops.bucketed_linear`); 0 = never."""
        self.ctx, self.device = ctx, ctx.device
        self.label_smoothing, self.clip_norm = label_smoothing, clip_norm
        self.precision = Precision.create(amp, self.device, min_loss_scale)
        self.model_cfg = model_cfg
        torch.manual_seed(seed)
        self.row_multiple = gemm_row_multiple if self.device.type == "cpu" and self.precision.dtype == torch.bfloat16 else 0
        """Rows of bf16 CPU training products are padded to a multiple of this (0: never)."""
        self.model = optimize_for(Transformer(model_cfg).to(self.device), self.device, self.precision.dtype,
                                  self.row_multiple)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=betas, eps=eps,
                                          weight_decay=weight_decay, fused=True)
        self.ddp_model = ctx.wrap(self.model)

    # -- one update ---------------------------------------------------------------------
    def step(self, micro_batches: list[tuple[Batch, float]], lr: float) -> StepStats | SkippedStep:
        """One update from this rank's micro-batches, each with weight 1 (real) or 0 (a dummy
        that keeps DDP's collectives in step when a rank has fewer batches than another).

        Gradients are sums over tokens divided by the update's total target tokens across all
        ranks, so N processes equal one process with N times the update frequency.
        """
        ctx = self.ctx
        local = torch.tensor([sum(b.n_tgt_tokens for b, w in micro_batches if w),
                              sum(b.n_src_tokens for b, w in micro_batches if w),
                              sum(b.n_sentences for b, w in micro_batches if w)], dtype=torch.float64)
        totals = ctx.all_reduce_sum(local.clone())
        tgt_tokens = totals[0].item()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        # Loss sums stay on the device until the update ends: one host sync per update, not per micro-step.
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        last = len(micro_batches) - 1
        for i, (batch, weight) in enumerate(micro_batches):
            batch = batch.to(self.device)
            sync = nullcontext() if i == last else ctx.no_sync(self.ddp_model)
            try:
                with sync:
                    loss, nll = forward_loss(self.ddp_model, batch, self.label_smoothing, self.precision, self.row_multiple)
                    self.precision.backward(loss * (weight * ctx.world_size / tgt_tokens))
            except torch.OutOfMemoryError:
                # Skipping on one rank would leave the others waiting in the all-reduce
                # (fairseq#810), so the whole job stops, checkpoints intact, with advice.
                raise NmtError(
                    f"out of memory on rank {ctx.rank} with a batch of {batch.n_sentences} sentences "
                    f"({batch.n_src_tokens}+{batch.n_tgt_tokens} tokens); lower --max-tokens (raise "
                    f"--update-freq to keep the batch), then re-run to resume from checkpoint_last.pt"
                ) from None
            if weight:
                sums += torch.stack([loss.detach().double(), nll.detach().double()])
        gnorm, ok = self.precision.unscale_and_clip(self.optimizer, self.model.parameters(), self.clip_norm)
        if not ok:
            self.optimizer.zero_grad(set_to_none=True)
            self.precision.update(skipped=True)
            return SkippedStep(gnorm, self.precision.scale_value())
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        stats = ctx.all_reduce_sum(sums.cpu())
        return StepStats(stats[0].item(), stats[1].item(), tgt_tokens, totals[1].item(), totals[2].item(), lr, gnorm)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.precision.state_dict()}

    def load_model(self, model_state: dict[str, Tensor]) -> None:
        try:
            self.model.load_state_dict(model_state)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise NmtError(f"the checkpoint's weights do not fit this model ({first[1].strip() if len(first) > 1 else first[0]})") from None

    def load_optimizer(self, optimizer_state: dict[str, Any]) -> None:
        try:
            self.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError) as e:
            raise NmtError(f"the checkpoint's optimizer state does not fit this model ({e}); "
                           f"pass --reset-optimizer on the first launch to start Adam afresh") from None

    def load_scaler(self, scaler_state: Optional[dict[str, Any]]) -> None:
        if scaler_state:
            self.precision.load_state_dict(scaler_state)
