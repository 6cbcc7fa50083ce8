"""Chunks of aligned lines through worker processes, results in input order, memory bounded.

The parent reads both files in chunks of raw bytes; workers decode, Moses-tokenize, clean and
encode them; results come back in order with only a few chunks in flight per worker.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections import deque
from dataclasses import dataclass
from itertools import compress, islice
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

import numpy as np

from nmt.preprocess.cleaning import CleaningRules
from nmt.errors import NmtError
from nmt.data.textio import decode_block, open_binary

if TYPE_CHECKING:
    from nmt.preprocess.vocab_sample import UniformSample

CHUNK_LINES = 10_000
"""Lines per chunk sent to a worker: large enough to amortize IPC, small enough for flat memory."""


@dataclass(frozen=True)
class Job:
    """What a worker needs to process chunks of one split (small: sent with every chunk)."""

    src_path: str
    tgt_path: str
    source_lang: str
    target_lang: str
    errors: str
    moses: bool
    rules: CleaningRules
    clean: bool
    src_vocab: Optional[str] = None
    tgt_vocab: Optional[str] = None
    vocab_type: str = "bpe"
    unk_id: int = 1
    dtype: str = "<u2"
    samples: int = 0
    """Sampled segmentations to encode besides the deterministic one (train only; subword_sampling)."""
    alpha: float = 0.1
    seed: int = 1


# A chunk task: (job, 1-based number of its first line, source lines, target lines,
# line numbers when the lines are not consecutive (a sample), else None).
Task = tuple[Job, int, bytes, bytes, Optional[np.ndarray]]


def init_worker() -> None:
    # The parent handles Ctrl-C and terminates the pool; HF tokenizers must not start its
    # thread pool in a forked child (one worker process = one core).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


class ChunkRunner:
    """Runs chunk tasks in worker processes, results in order, few chunks in flight.

    `Pool.imap` would read the whole input ahead into its task queue; keeping at most two
    chunks per worker in flight bounds memory. With one worker, tasks run in this process.
    """

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = None
        if workers > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ctx.Pool(workers, initializer=init_worker)

    def map(self, fn: Callable[[Task], Any], tasks: Iterable[Task]) -> Iterator[Any]:
        if self.pool is None:
            yield from map(fn, tasks)
            return
        pending: deque = deque()
        for task in tasks:
            pending.append(self.pool.apply_async(fn, (task,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __enter__(self) -> "ChunkRunner":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pool is None:
            return
        if exc_type is None:
            self.pool.close()
        else:
            self.pool.terminate()
        self.pool.join()


def read_chunks(job: Job, expected: int, sample: Optional["UniformSample"] = None) -> Iterator[Task]:
    """Chunks of aligned lines of both files, as raw bytes (workers decode them)."""
    with open_binary(job.src_path) as fs, open_binary(job.tgt_path) as ft:
        start = 1
        while True:
            src = list(islice(fs, CHUNK_LINES))
            tgt = list(islice(ft, CHUNK_LINES))
            n_read = len(src)
            if n_read != len(tgt) or start - 1 + n_read > expected:
                raise NmtError(f"{job.src_path} or {job.tgt_path} changed while being read; run again")
            if n_read == 0:
                break
            linenos = None
            if sample is not None:
                mask = sample.take(n_read)
                if not mask.all():
                    linenos = start + np.flatnonzero(mask)
                    src, tgt = list(compress(src, mask)), list(compress(tgt, mask))
            if src:
                yield job, start, b"".join(src), b"".join(tgt), linenos
            start += n_read
        if start - 1 != expected:
            raise NmtError(f"{job.src_path} or {job.tgt_path} changed while being read; run again")


def prepared_pairs(task: Task) -> tuple[list[str], list[str]]:
    """Decode a chunk's lines (and Moses-tokenize them when asked)."""
    job, start, src_block, tgt_block, linenos = task
    src = decode_block(src_block, job.src_path, start, job.errors, linenos)
    tgt = decode_block(tgt_block, job.tgt_path, start, job.errors, linenos)
    if job.moses:
        from nmt.data.moses import moses_preprocess

        src, tgt = moses_preprocess(src, job.source_lang), moses_preprocess(tgt, job.target_lang)
    return src, tgt


def progress_bar(total: int, desc: str, progress: bool) -> Any:
    """A tqdm bar on stderr when it is a terminal (disable=None), nothing in logs and pipes."""
    from tqdm import tqdm

    return tqdm(total=total, unit=" pairs", desc=desc, file=sys.stderr, disable=None if progress else True,
                unit_scale=True, dynamic_ncols=True, leave=False)
