"""Dynamic batching: shared model calls, answers in order, and small requests not stuck behind big ones."""

from __future__ import annotations

import threading
import time

import pytest

from nmt.serve.batcher import Batcher
from nmt.inference.translator import Translation


class FakeModel:
    """Upper-cases each line; records every call; each call takes `seconds`."""

    def __init__(self, seconds: float = 0.0):
        self.calls: list[tuple[list[str], dict]] = []
        self.seconds = seconds
        self.started = threading.Event()

    def __call__(self, lines, search):
        self.started.set()
        time.sleep(self.seconds)
        self.calls.append((list(lines), dict(search)))
        return [Translation(l.upper(), -1.0, [(l.upper(), -1.0)]) for l in lines]


class Answers:
    """What each request got, and how many model calls had been made when it got it."""

    def __init__(self, model: FakeModel):
        self.model, self.got, self.calls_when_done = model, {}, {}
        self.cond = threading.Condition()

    def done_for(self, name: str):
        def done(found, error):
            with self.cond:
                self.got[name] = error if error is not None else [t.hyp for t in found]
                self.calls_when_done[name] = len(self.model.calls)
                self.cond.notify_all()
        return done

    def wait(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) == n, timeout=30)


def test_requests_arriving_together_share_a_call_and_get_their_own_lines_in_order():
    model = FakeModel()
    answers = Answers(model)
    batcher = Batcher(model, window=0.2, max_sentences=64)
    requests = {f"r{i}": [f"line {i}.{j}" for j in range(i + 1)] for i in range(5)}
    for name, lines in requests.items():
        batcher.submit(lines, {}, answers.done_for(name))
    batcher.submit([], {}, answers.done_for("empty"))
    answers.wait(6)
    batcher.close()
    assert answers.got == {**{n: [l.upper() for l in lines] for n, lines in requests.items()}, "empty": []}
    assert len(model.calls) == 1 and batcher.stats.batches == 1 and batcher.stats.requests == 6


def test_a_small_request_rides_in_the_next_call_not_after_a_huge_one():
    model = FakeModel(seconds=0.02)
    answers = Answers(model)
    batcher = Batcher(model, window=0.0, max_sentences=8)
    batcher.submit([f"big {i}" for i in range(200)], {}, answers.done_for("big"))
    assert model.started.wait(10)
    batcher.submit(["small"], {}, answers.done_for("small"))
    answers.wait(2)
    batcher.close()
    assert answers.calls_when_done["small"] <= 2  # the big one needs 25 calls; the small one waits for one at most
    assert answers.calls_when_done["big"] == 26
    assert answers.got["big"] == [f"BIG {i}" for i in range(200)]
    assert all(len(lines) <= 8 for lines, _ in model.calls)


def test_other_search_settings_never_share_a_call():
    model = FakeModel()
    answers = Answers(model)
    batcher = Batcher(model, window=0.2, max_sentences=64)
    batcher.submit(["a", "b"], {"beam": 2}, answers.done_for("beam2"))
    batcher.submit(["c"], {}, answers.done_for("default"))
    batcher.submit(["d"], {"beam": 2}, answers.done_for("beam2 again"))
    answers.wait(3)
    batcher.close()
    assert sorted((sorted(lines), search) for lines, search in model.calls) == \
        [(["a", "b", "d"], {"beam": 2}), (["c"], {})]
    assert answers.got == {"beam2": ["A", "B"], "default": ["C"], "beam2 again": ["D"]}


def test_an_error_in_a_model_call_reaches_every_request_in_it():
    def broken(lines, search):
        raise RuntimeError("out of memory")

    answers = Answers(FakeModel())
    batcher = Batcher(broken, window=0.1, max_sentences=64)
    batcher.submit(["x"], {}, answers.done_for("x"))
    batcher.submit(["y"], {}, answers.done_for("y"))
    answers.wait(2)
    batcher.close()
    assert all(isinstance(e, RuntimeError) for e in answers.got.values())
    assert batcher.stats.errors == 1


def test_the_model_is_loaded_on_the_thread_that_runs_every_model_call():
    """One computing thread: a model loaded on another thread slowed every CPU call (libgomp)."""
    threads: list[str] = []

    def load():
        threads.append(threading.current_thread().name)
        return "model"

    def translate(lines, search):
        threads.append(threading.current_thread().name)
        return [Translation(l, -1.0, [(l, -1.0)]) for l in lines]

    answers = Answers(FakeModel())
    batcher = Batcher(translate, window=0.0, max_sentences=8, init=load)
    assert batcher.wait_ready() == "model"
    batcher.submit(["a"], {}, answers.done_for("a"))
    answers.wait(1)
    batcher.close()
    assert answers.got == {"a": ["a"]}
    assert len(threads) == 2 and threads[0] == threads[1] != threading.current_thread().name


def test_a_failed_load_is_raised_to_the_caller_and_the_batcher_takes_nothing():
    def load():
        raise RuntimeError("no checkpoint")

    batcher = Batcher(lambda lines, search: [], window=0.0, max_sentences=8, init=load)
    with pytest.raises(RuntimeError, match="no checkpoint"):
        batcher.wait_ready()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(["a"], {}, lambda found, error: None)
    batcher.close()


def test_a_call_starts_once_the_clients_of_the_previous_one_are_back():
    """Closed-loop clients: after the first call, the next starts when all of them have sent
    their next request, not when the (here very long) window ends."""
    model = FakeModel()
    batcher = Batcher(model, window=2.0, max_sentences=64)
    rounds, clients = 3, 4
    finished = threading.Semaphore(0)

    def client(c: int, left: int) -> None:
        def done(found, error):
            assert error is None and [t.hyp for t in found] == [f"C{c} R{rounds - left}"]
            if left > 1:
                client(c, left - 1)
            else:
                finished.release()
        batcher.submit([f"c{c} r{rounds - left}"], {}, done)

    start = time.monotonic()
    for c in range(clients):
        client(c, rounds)
    for _ in range(clients):
        assert finished.acquire(timeout=30)
    elapsed = time.monotonic() - start
    batcher.close()
    assert [len(lines) for lines, _ in model.calls] == [clients] * rounds
    assert elapsed < 2.0 + 1.5  # the first call waits its window; the waiting rule alone would take 6 s
