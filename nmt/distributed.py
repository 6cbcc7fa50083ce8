"""Data-parallel training with PyTorch's own engine (DistributedDataParallel).

Three ways in, one code path:
- one process (CPU, or one GPU);
- several local processes started here, one per visible GPU as fairseq does (or
  `--distributed-world-size N --device cpu`, DDP over gloo, which is how it is tested);
- `torchrun` (any number of nodes): rank and world size come from its environment.
NCCL on GPUs, gloo on CPU. A worker that dies takes the job down with its rank named.
"""

from __future__ import annotations

import os
import socket
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import Tensor, nn

from nmt.errors import NmtError


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def _comm(self, t: Tensor) -> Tensor:
        return t.to(self.device) if self.device.type == "cuda" else t

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        if not self.distributed:
            return t
        c = self._comm(t)
        dist.all_reduce(c)
        return c.cpu()

    def broadcast_from_main(self, t: Tensor) -> Tensor:
        if not self.distributed:
            return t
        c = self._comm(t)
        dist.broadcast(c, src=0)
        return c.cpu()

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def wrap(self, model: nn.Module) -> nn.Module:
        if not self.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Skip the gradient all-reduce on non-final micro-steps of an update."""
        return model.no_sync() if self.distributed else nullcontext()


def resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise NmtError("--device cuda was asked for, but PyTorch sees no CUDA GPU; use --device cpu")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[..., Any], run_dir: Any, cfg: Any) -> Any:
    """Run `fn(ctx, run_dir, cfg)` on every rank; returns rank 0's result when in-process."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        return _run_rank(int(os.environ.get("LOCAL_RANK", 0)), fn, run_dir, cfg, None)
    base = resolve_device(cfg.device)
    world = cfg.distributed_world_size or (torch.cuda.device_count() if base.type == "cuda" else 1)
    if base.type == "cuda" and world > torch.cuda.device_count():
        raise NmtError(f"--distributed-world-size {world} but only {torch.cuda.device_count()} GPU(s) are visible")
    if world <= 1:
        device = torch.device("cuda", 0) if base.type == "cuda" else base
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return fn(DistContext(0, 1, 0, device), run_dir, cfg)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world)}
    import torch.multiprocessing as mp

    try:
        mp.start_processes(_spawned, args=(fn, run_dir, cfg, env), nprocs=world, join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        raise NmtError(
            f"training process rank {e.error_index} died ({_describe_exit(e.exit_code)}); the others were stopped "
            f"and checkpoints are intact; re-run the same command to resume from checkpoint_last.pt"
        ) from None
    except mp.ProcessRaisedException as e:
        last = [l for l in str(e).strip().splitlines() if l.strip()][-1]
        raise NmtError(f"training process rank {e.error_index} failed: {last}") from None
    return None


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown exit"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def _spawned(local_rank: int, fn: Callable[..., Any], run_dir: Any, cfg: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["RANK"] = str(local_rank)
    os.environ["LOCAL_RANK"] = str(local_rank)
    try:
        _run_rank(local_rank, fn, run_dir, cfg, env)
    except NmtError as e:
        # one line from the failing rank; the parent names the rank and stops the rest
        print(f"nmt: error: rank {local_rank}: {e}", file=sys.stderr)
        sys.exit(1)


def _run_rank(local_rank: int, fn: Callable[..., Any], run_dir: Any, cfg: Any, env: Any) -> Any:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    base = resolve_device(cfg.device)
    if base.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        if not getattr(cfg, "threads", 0):  # share the cores instead of oversubscribing them
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group(backend=backend, rank=rank, world_size=world)
    try:
        return fn(DistContext(rank, world, local_rank, device), run_dir, cfg)
    finally:
        dist.destroy_process_group()
