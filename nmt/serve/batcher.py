"""Dynamic batching for `nmt serve`: requests that arrive together share one model call.

One worker thread owns the model. A call starts `window` seconds after the later of the
oldest waiting request's arrival and the end of the previous call, or as soon as
`max_sentences` are waiting: requests that arrive while the model is busy go into the next
call together, and so do the clients of the call just answered that send their next request
right away (without the wait after a call, closed-loop clients split into two groups that
take turns, each with half-full calls). A call also starts once the waiting sentences number
as many as the previous call held: when the clients just answered are all back, the rest of
the window would only leave the model idle (one closed-loop client kept the model busy for less
of the time with the whole window). A call takes sentences from the waiting requests in turns,
one sentence each round, oldest request first, so a request of hundreds of sentences is
spread over several calls and a one-sentence request that arrives meanwhile rides in the
very next call. Requests with other beam search settings cannot share a call: the settings
of the oldest waiting request choose the call.

A request whose client went away is dropped (`cancel`): its sentences not yet in a call are
never translated. At shutdown (`stop`) the requests that have not started are answered with
ShuttingDown at once and new ones are refused; those started go on, call by call, until they
are done or cancelled, so the model stops at the end of the call in progress.

The worker thread can also load the model (`init`), so that one thread does all of the
model's work. That matters on CPU: PyTorch's OpenMP runtime (libgomp) gives every thread that
runs parallel operations its own team of worker threads, and once a process holds more of
them than it has cores, libgomp shortens the time its workers spin between operations to
almost nothing. A model loaded on the main thread and run on this one did exactly that: each
of the decoder's small operations then waited for sleeping workers to wake, and `nmt serve`
translated far slower than the same calls on one thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from nmt.inference.translator import Translation

TranslateFn = Callable[[Sequence[str], dict[str, Any]], list[Translation]]
"""(sentences, beam search overrides) -> one Translation per sentence, in order."""

Done = Callable[[Optional[list[Translation]], Optional[BaseException]], None]
"""Called once per request (unless it is cancelled): the translations, or the error."""


class ShuttingDown(RuntimeError):
    """The batcher takes no more work: the request was not translated, and may be sent again."""


@dataclass
class _Request:
    lines: list[str]
    search: dict[str, Any]
    key: tuple
    done: Done
    arrived: float
    results: list[Optional[Translation]] = field(default_factory=list)
    taken: int = 0
    finished: int = 0
    failed: bool = False
    """Answered with an error, or cancelled: its results are dropped."""


@dataclass
class BatchStats:
    """Counters shown by /info: how many requests and sentences, in how many model calls."""

    requests: int = 0
    sentences: int = 0
    batches: int = 0
    largest_batch: int = 0
    errors: int = 0
    cancelled: int = 0
    """Requests given up before their answer (client gone, or shutdown out of time)."""
    busy_seconds: float = 0.0
    """Time spent in model calls: against the wall clock, how busy the model was."""


class Batcher:
    """Collects requests from any thread and translates them in shared model calls on one worker thread."""

    def __init__(self, translate: TranslateFn, window: float, max_sentences: int,
                 init: Optional[Callable[[], Any]] = None):
        """`init`, if given, runs first on the worker thread (load the model there); `wait_ready`
        returns its result."""
        self._translate, self.window, self.max_sentences = translate, window, max_sentences
        self._init = init
        self._ready = threading.Event()
        self._init_result: Any = None
        self._init_error: Optional[BaseException] = None
        self._waiting: list[_Request] = []
        self._cond = threading.Condition()
        self._closed = False
        self._stopping = False
        self._idle_since = 0.0
        self._expected = max_sentences
        """Sentences that start a call before its window ends: the previous call's."""
        self.stats = BatchStats()
        self._thread = threading.Thread(target=self._run, name="nmt-batcher", daemon=True)
        self._thread.start()

    def submit(self, lines: Sequence[str], search: dict[str, Any], done: Done) -> _Request:
        """Queue `lines`; `done` is called from the worker thread when all are translated. The
        request returned is what `cancel` takes."""
        req = _Request(list(lines), dict(search), tuple(sorted(search.items())), done, time.monotonic())
        req.results = [None] * len(req.lines)
        with self._cond:
            if self._closed or self._stopping:
                raise ShuttingDown("the batcher is closed: the server is shutting down")
            self.stats.requests += 1
            if not req.lines:
                done([], None)
                return req
            self._waiting.append(req)
            self._cond.notify()
        return req

    def cancel(self, req: _Request) -> None:
        """Give up `req` (its client went away, or the shutdown ran out of time): none of its
        sentences not yet in a call is translated, and `done` is not called."""
        with self._cond:
            if req.failed or req.finished == len(req.lines):
                return
            self.stats.cancelled += 1
            self._drop([req])

    def stop(self) -> None:
        """Shutting down: refuse new requests, answer the waiting ones that have not started
        with ShuttingDown now, and go on with those started (cancel them when out of time)."""
        with self._cond:
            self._stopping = True
            unstarted = self._drop([r for r in self._waiting if r.taken == 0])
            self._cond.notify()
        for req in unstarted:
            req.done(None, ShuttingDown("the server is shutting down"))

    def wait_ready(self) -> Any:
        """Wait for `init` on the worker thread; its result, or its exception raised here."""
        self._ready.wait()
        if self._init_error is not None:
            raise self._init_error
        return self._init_result

    def close(self) -> None:
        """Translate what is waiting, then stop the worker thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            self._init_result = self._init() if self._init is not None else None
        except BaseException as e:  # noqa: BLE001 - handed to wait_ready's caller
            self._init_error = e
            with self._cond:
                self._closed = True
            return
        finally:
            self._ready.set()
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                deadline = max(self._waiting[0].arrived, self._idle_since) + self.window
                while (not (self._closed or self._stopping) and self._waiting_like(self._waiting[0].key) < self._expected
                       and (left := deadline - time.monotonic()) > 0):
                    self._cond.wait(left)
                batch = self._take()
                self._expected = len(batch)
            self._translate_batch(batch)
            self._idle_since = time.monotonic()

    def _waiting_like(self, key: tuple) -> int:
        return sum(len(r.lines) - r.taken for r in self._waiting if r.key == key)

    def _take(self) -> list[tuple[_Request, int]]:
        """Up to max_sentences (request, line index) pairs: one sentence per request per round."""
        key = self._waiting[0].key
        turn = [r for r in self._waiting if r.key == key]
        batch: list[tuple[_Request, int]] = []
        while turn and len(batch) < self.max_sentences:
            for req in list(turn):
                if len(batch) == self.max_sentences:
                    break
                batch.append((req, req.taken))
                req.taken += 1
                if req.taken == len(req.lines):
                    turn.remove(req)
        self._waiting = [r for r in self._waiting if r.taken < len(r.lines)]
        return batch

    def _translate_batch(self, batch: list[tuple[_Request, int]]) -> None:
        req0 = batch[0][0]
        start = time.monotonic()
        try:
            found = self._translate([req.lines[i] for req, i in batch], req0.search)
        except BaseException as e:  # noqa: BLE001 - every waiting client must hear of it
            with self._cond:
                self.stats.errors += 1
                failed = self._drop(list({id(req): req for req, _ in batch}.values()))
            for req in failed:
                req.done(None, e)
            return
        with self._cond:
            self.stats.busy_seconds += time.monotonic() - start
            self.stats.batches += 1
            self.stats.sentences += len(batch)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            complete = []
            for (req, i), tr in zip(batch, found):
                req.results[i] = tr
                req.finished += 1
                if req.finished == len(req.lines) and not req.failed:
                    complete.append(req)
        for req in complete:
            req.done(list(req.results), None)  # type: ignore[arg-type]

    def _drop(self, requests: list[_Request]) -> list[_Request]:
        """Take `requests` out of the queue for good (the lock held); those not dropped before."""
        dropped = [r for r in requests if not r.failed]
        for req in dropped:
            req.failed = True
        self._waiting = [r for r in self._waiting if not r.failed]
        return dropped
