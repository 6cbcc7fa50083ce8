"""`nmt serve` against clients that stall or go away, and against SIGTERM: a body that stops
arriving is answered (408, or 503 once SIGTERM came) instead of holding its connection and the
shutdown forever; a client that goes away gets no more model work; SIGTERM answers every request
(200 or 503, never 500) and the server exits within --shutdown-grace-s and the call in progress."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from types import SimpleNamespace
from typing import Callable

import pytest

pytest.importorskip("starlette", reason="nmt serve needs the serve extra (make install installs it)")
pytest.importorskip("uvicorn", reason="nmt serve needs the serve extra (make install installs it)")

from nmt.inference.translator import Translation  # noqa: E402
from nmt.serve.app import build_app  # noqa: E402
from nmt.serve.batcher import Batcher, ShuttingDown  # noqa: E402
from nmt.serve.config import ServeConfig  # noqa: E402
from serve_helpers import Server  # noqa: E402
from test_translate import _lines, run_dir  # noqa: E402, F401  (fixture)

STALLED_REQUEST = (b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 100\r\n\r\n{\"text\": ")
"""Headers that announce 100 bytes of body, and the first 9 of them."""


def _post_stalled_body(app, after_first_chunk=None) -> tuple[int, list, dict]:
    """Call the ASGI app with a POST /translate whose body stops after its first chunk; the
    status, headers and JSON it answers. `after_first_chunk` runs when the app asks for more."""
    async def call() -> tuple[int, list, dict]:
        chunks = [b'{"text": ']
        sent: list[dict] = []

        async def receive() -> dict:
            if chunks:
                return {"type": "http.request", "body": chunks.pop(), "more_body": True}
            if after_first_chunk is not None:
                after_first_chunk()
            await asyncio.Event().wait()  # the client sends nothing more, ever
            raise AssertionError("unreachable")

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/translate", "raw_path": b"/translate", "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
                 "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000)}
        await asyncio.wait_for(app(scope, receive, send), timeout=30)
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return sent[0]["status"], sent[0]["headers"], json.loads(body)

    return asyncio.run(call())


def test_a_body_that_stops_arriving_gets_a_408():
    app = build_app(SimpleNamespace(cfg=ServeConfig()), body_timeout=0.2)
    status, headers, answer = _post_stalled_body(app)
    assert status == 408 and answer == {"error": "the body did not arrive within 0.2 s"}
    assert (b"connection", b"close") in headers  # the rest of the body is not waited for


def test_a_body_still_arriving_at_shutdown_gets_a_503_at_once():
    app = build_app(SimpleNamespace(cfg=ServeConfig()), body_timeout=600)
    start = time.monotonic()
    status, headers, answer = _post_stalled_body(app, after_first_chunk=app.state.stopping.set)
    assert status == 503 and "shutting down" in answer["error"] and (b"connection", b"close") in headers
    assert time.monotonic() - start < 10


def test_sigterm_ends_the_server_soon_while_a_client_stalls_mid_body(run_dir, tmp_path):
    srv = Server(run_dir, "--threads", "1", log_dir=tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as client:
            client.sendall(STALLED_REQUEST)
            time.sleep(0.5)  # for the server to read the headers (if it has not, it closes the connection instead)
            start = time.monotonic()
            code = srv.terminate(timeout=30)
            elapsed = time.monotonic() - start
            reply = client.recv(4096)
        assert code == 0 and elapsed < 10, (code, elapsed, srv.output())
        assert reply == b"" or reply.startswith(b"HTTP/1.1 503 "), reply
        assert "Traceback" not in srv.output()
    finally:
        srv.stop()


# -- clients that go away, and the shutdown, in the batcher -------------------------------

class HeldModel:
    """A model whose every call waits until the test lets it end; records each call's lines."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.calling = threading.Semaphore(0)
        self.go = threading.Semaphore(0)

    def __call__(self, lines, search):
        self.calls.append(list(lines))
        self.calling.release()
        assert self.go.acquire(timeout=30)
        return [Translation(line.upper(), -1.0, [(line.upper(), -1.0)]) for line in lines]

    def finish_call(self) -> None:
        """Wait for the next call to start, then let it end."""
        assert self.calling.acquire(timeout=30)
        self.go.release()


def _answers() -> tuple[dict, Callable]:
    """What each request got (its lines or its error), and a `done` for each name."""
    got: dict = {}

    def done_for(name: str):
        return lambda found, error: got.__setitem__(name, error if error is not None else [t.hyp for t in found])
    return got, done_for


def test_a_cancelled_request_gets_no_more_model_work_and_no_answer():
    model, (got, done_for) = HeldModel(), _answers()
    batcher = Batcher(model, window=0.0, max_sentences=1)
    ticket = batcher.submit(["a", "b", "c"], {}, done_for("gone"))
    assert model.calling.acquire(timeout=30)  # "a" is in a model call
    batcher.cancel(ticket)  # its client went away
    batcher.submit(["x"], {}, done_for("next"))
    model.go.release()
    model.finish_call()
    batcher.close()
    assert model.calls == [["a"], ["x"]] and got == {"next": ["X"]}
    assert batcher.stats.cancelled == 1


def test_at_shutdown_requests_not_started_get_shutting_down_at_once_and_those_started_are_finished():
    model, (got, done_for) = HeldModel(), _answers()
    batcher = Batcher(model, window=0.0, max_sentences=1)
    batcher.submit(["a", "b"], {}, done_for("started"))
    assert model.calling.acquire(timeout=30)  # "a" is in a model call
    batcher.submit(["c"], {}, done_for("waiting"))  # would ride in the next call
    batcher.stop()
    assert isinstance(got.pop("waiting"), ShuttingDown) and got == {}  # answered while the model is still busy
    with pytest.raises(ShuttingDown):
        batcher.submit(["d"], {}, done_for("late"))
    model.go.release()
    model.finish_call()
    batcher.close()
    assert model.calls == [["a"], ["b"]] and got == {"started": ["A", "B"]}


# -- the same with a real server ------------------------------------------------------------

LONG_REQUEST = {"text": _lines(256, 5), "beam": 16, "constraints": [["Hunde", "Kinder"]] * 256}
"""A constrained search at beam 16 over 256 sentences: one sentence per call (--max-batch-sentences 1)."""
LONG_FLAGS = ("--threads", "1", "--max-batch-sentences", "1", "--max-len-b", "40")


def test_a_client_that_goes_away_gets_no_more_model_work(run_dir, tmp_path):
    srv = Server(run_dir, *LONG_FLAGS, log_dir=tmp_path)
    try:
        body = json.dumps(LONG_REQUEST).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as client:
            client.sendall(b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            srv.wait_for_stats(lambda s: s["sentences"] >= 1)  # in flight
        at_cancel = srv.wait_for_stats(lambda s: s["cancelled"] == 1)
        status, answer = srv.post({"text": "ein Mann"})  # a call after the one that was in progress
        assert status == 200, answer
        after = srv.get("/info")["stats"]
        # At most the sentence in its call then, and this one: none of the other 250 or so.
        assert after["sentences"] <= at_cancel["sentences"] + 2 and after["sentences"] < 256, (at_cancel, after)
        assert srv.terminate() == 0 and "Traceback" not in srv.output()
    finally:
        srv.stop()


def test_sigterm_during_a_long_constrained_request_answers_200_or_503_and_exits_within_the_grace(run_dir, tmp_path):
    grace = 1.0
    srv = Server(run_dir, *LONG_FLAGS, "--shutdown-grace-s", str(grace), log_dir=tmp_path)
    try:
        answers: list = []
        client = threading.Thread(target=lambda: answers.append(srv.post(LONG_REQUEST, timeout=300)))
        client.start()
        srv.wait_for_stats(lambda s: s["sentences"] >= 1)  # in flight
        start = time.monotonic()
        code = srv.terminate(timeout=120)
        elapsed = time.monotonic() - start
        client.join(timeout=300)
        (status, answer), = answers
        assert code == 0, srv.output()
        assert status == 503 and answer == {"error": "the server is shutting down; send the request again"} or \
            status == 200 and len(answer["translations"]) == 256, (status, answer)
        # The grace, then the call in progress (one sentence) and the exit, with a minute of room for a loaded
        # machine: far below the 256 calls the request holds (before: 500s after 30 s, still running at 126 s).
        assert elapsed < grace + 60, (elapsed, srv.output())
        assert "Traceback" not in srv.output()
    finally:
        srv.stop()
