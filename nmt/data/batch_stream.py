"""Collated batches prepared by a background thread while the model trains (off the critical path).

An update takes one group of batches (world_size x update_freq of them, see `Trainer.epoch_groups`);
this rank trains on every world_size-th batch of the group. Padding the ids into tensors (and,
for a GPU, copying them into page-locked memory so the host-to-device copy runs asynchronously)
costs milliseconds per batch that the accelerator would otherwise wait for. A thread is enough:
collation is numpy work that releases the GIL, and the order of what comes out is the order of
the groups, whatever the timing, so training stays a pure function of (seed, epoch).

    with BatchStream(src, tgt, groups, rank=r, world_size=w, device=dev, start=done) as stream:
        for update in stream:          # PreparedUpdate, in group order from `start`
            for batch in update.batches: ...

A failure while collating is raised by the iteration, in the training thread, as itself.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from nmt.data.batching import Batch, collate
from nmt.data.token_arrays import TokenArray


@dataclass
class PreparedUpdate:
    """One update's share for this rank: its batches on the device, in micro-step order."""

    position: int
    """Index of the group in the epoch's list (resume from `position + 1`)."""
    batches: list[Batch]
    """This rank's batches: the group's batches rank, rank + world_size, ..."""
    filler: Optional[Batch]
    """When this rank has fewer batches than the busiest rank: a batch (the group's first) for
    the extra zero-weight micro-step that keeps DDP's collectives in step; else None."""
    micro_steps: int
    """Micro-steps every rank runs for this group (ceil(len(group) / world_size))."""

    def weighted(self) -> list[tuple[Batch, float]]:
        """The micro-steps as (batch, weight): this rank's batches (1), then the filler (0)."""
        return [(b, 1.0) for b in self.batches] + [(self.filler, 0.0)] * (self.micro_steps - len(self.batches))

    @property
    def n_tgt_tokens(self) -> int:
        return sum(b.n_tgt_tokens for b in self.batches)

    @property
    def n_src_tokens(self) -> int:
        return sum(b.n_src_tokens for b in self.batches)

    @property
    def n_sentences(self) -> int:
        return sum(b.n_sentences for b in self.batches)


def prepare_group(group: Sequence[np.ndarray], position: int, rank: int, world_size: int,
                  collate_one: Callable[[np.ndarray], Batch]) -> PreparedUpdate:
    """This rank's share of one update's group: every rank runs ceil(len(group) / world_size)
    micro-steps, so a rank with fewer batches gets a filler batch of weight 0."""
    mine = [collate_one(ids) for ids in group[rank::world_size]]
    micro_steps = -(-len(group) // world_size)
    filler = collate_one(group[0]) if len(mine) < micro_steps else None
    return PreparedUpdate(position, mine, filler, micro_steps)


_DONE = object()


class BatchStream:
    """Iterate over `groups[start:]` as PreparedUpdates, `depth` of them prepared ahead by a thread."""

    def __init__(
        self,
        src: TokenArray,
        tgt: TokenArray,
        groups: Sequence[Sequence[np.ndarray]],
        *,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device = torch.device("cpu"),
        start: int = 0,
        depth: int = 2,
        collate_fn: Callable[[TokenArray, TokenArray, np.ndarray], Batch] = collate,
    ):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.src, self.tgt, self.groups = src, tgt, groups
        self.rank, self.world_size, self.device, self.start = rank, world_size, torch.device(device), start
        self.collate_fn = collate_fn
        self.pin = self.device.type == "cuda"
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="nmt-batch-stream", daemon=True)
        self._thread.start()

    # -- the background thread ----------------------------------------------------------
    def _prepare(self, position: int) -> PreparedUpdate:
        return prepare_group(self.groups[position], position, self.rank, self.world_size, self._collate)

    def _collate(self, ids: np.ndarray) -> Batch:
        batch = self.collate_fn(self.src, self.tgt, ids)
        return batch.pin_memory() if self.pin else batch

    def _produce(self) -> None:
        try:
            for position in range(self.start, len(self.groups)):
                if not self._put(self._prepare(position)):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the training thread, which raises it
            self._put(e)

    def _put(self, item: object) -> bool:
        """Queue `item`, waiting for room; False once the stream was closed."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    # -- the training thread ------------------------------------------------------------
    def __iter__(self) -> Iterator[PreparedUpdate]:
        return self

    def __next__(self) -> PreparedUpdate:
        if self._stop.is_set():
            raise StopIteration
        item = self._queue.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        if self.device.type != "cpu":
            item.batches = [b.to(self.device) for b in item.batches]
            item.filler = item.filler.to(self.device) if item.filler is not None else None
        return item

    def close(self) -> None:
        """Stop the thread (it finishes the group it is collating) and drop what was prepared."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
