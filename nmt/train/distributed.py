"""Data-parallel training with PyTorch's own engine (DistributedDataParallel).

Three ways in, one code path:
- one process (CPU, or one GPU);
- several local processes started here, one per visible GPU as fairseq does (or
  `--distributed-world-size N --device cpu`, DDP over gloo, which is how it is tested);
- `torchrun` (any number of nodes): rank and world size come from its environment.
NCCL on GPUs, gloo on CPU. A worker that dies takes the job down with its rank named; a user
error in a worker is the one line it would be in one process.
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import socket
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from nmt.device import resolve_device, worker_processes
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
        # The only buffer is the sinusoidal table, the same on every rank: no sync per forward.
        # Newer torch renamed the flag and warns on the old one, once per rank.
        new = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        no_sync = {"forward_sync_buffers" if new else "broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=ids, **no_sync)

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Skip the gradient all-reduce on non-final micro-steps of an update."""
        return model.no_sync() if self.distributed else nullcontext()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[..., Any], run_dir: Any, cfg: Any, resume_from: Optional[Path] = None) -> Any:
    """Run `fn(ctx, run_dir, cfg)` on every rank; returns rank 0's result when in-process.

    `resume_from` is the checkpoint a re-run continues from: a crashed worker's message points
    to it when it exists, and only then.
    """
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        return _run_rank(int(os.environ.get("LOCAL_RANK", 0)), fn, run_dir, cfg)
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

    # Its warnings that it stops the other ranks would come on top of our one line, which says so.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="nmt-errors-") as errors:
        try:
            mp.start_processes(_spawned, args=(fn, run_dir, cfg, env, errors), nprocs=world, join=True,
                               start_method=worker_processes(fn.__module__).get_start_method())
        except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
            user_error = _user_error(Path(errors), e.error_index)
            if user_error is not None:
                raise user_error from None
            how = (f"died ({_describe_exit(e.exit_code)})" if isinstance(e, mp.ProcessExitedException)
                   else "failed: " + [l for l in str(e).splitlines() if l.strip()][-1])
            resume = (f"; checkpoints are intact: re-run the same command to resume from {resume_from.name}"
                      if resume_from is not None and resume_from.is_file() else "")
            raise NmtError(f"training process rank {e.error_index} {how}; the others were stopped{resume}") from None
    return None


def _user_error(errors: Path, first: int) -> Optional[NmtError]:
    """The NmtError a worker stopped with (see `_spawned`): the first failed rank's, else the
    lowest rank's, since a rank can fail in a collective before its peer's exit is seen."""
    files = sorted(errors.iterdir(), key=lambda f: (f.name != str(first), int(f.name)))
    return pickle.loads(files[0].read_bytes()) if files else None


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


def _spawned(local_rank: int, fn: Callable[..., Any], run_dir: Any, cfg: Any, env: dict[str, str], errors: str) -> None:
    os.environ.update(env)
    os.environ["RANK"] = str(local_rank)
    os.environ["LOCAL_RANK"] = str(local_rank)
    try:
        _run_rank(local_rank, fn, run_dir, cfg)
    except NmtError as e:
        # Handed to the parent, which prints it as the job's one line: only it knows that this
        # was a user error, whose fix is not a re-run, and not a crash.
        (Path(errors) / str(local_rank)).write_bytes(pickle.dumps(e))
        sys.exit(e.exit_code)


def _run_rank(local_rank: int, fn: Callable[..., Any], run_dir: Any, cfg: Any) -> Any:
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
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's default
    store = {"store": _this_round_store(rank, world)} if agent_store else {}
    dist.init_process_group(backend=backend, rank=rank, world_size=world, **store)
    try:
        return fn(DistContext(rank, world, local_rank, device), run_dir, cfg)
    finally:
        dist.destroy_process_group()


def _this_round_store(rank: int, world: int) -> dist.Store:
    """torchrun's store for this round of workers, under keys no earlier round used.

    The agents keep one TCPStore for the whole job (TORCHELASTIC_USE_AGENT_STORE), so after a
    restart (`--max-restarts`) the killed round's keys, its ranks' addresses among them, are
    still there: a new rank that reads a dead peer's address fails to connect or waits forever
    (pytorch#135712; TORCHELASTIC_RESTART_COUNT, meant to tell rounds apart, is counted per node
    and differs between nodes). So rank 0 draws a fresh prefix and hands it to each rank under a
    key named by that rank's own fresh nonce, which no earlier round can have written.
    """
    from torch.distributed.constants import default_pg_timeout

    store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"], port=int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=default_pg_timeout)
    mine = uuid.uuid4().hex
    if rank != 0:
        store.set(f"nmt/hello/{rank}", mine)
        prefix = store.get(f"nmt/prefix/{mine}").decode()
        store.set(f"nmt/{prefix}/joined/{rank}", "1")
        return dist.PrefixStore(f"nmt/{prefix}", store)
    waiting = set(range(1, world))
    deadline = time.monotonic() + default_pg_timeout.total_seconds()
    while waiting and time.monotonic() < deadline:
        for r in sorted(waiting):  # a hello may be stale until rank r writes its own: answer each
            store.set(f"nmt/prefix/{store.get(f'nmt/hello/{r}').decode()}", mine)
            if store.check([f"nmt/{mine}/joined/{r}"]):
                waiting.discard(r)
        time.sleep(0.02)
    return dist.PrefixStore(f"nmt/{mine}", store)
