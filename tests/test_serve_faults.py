"""`nmt serve` against clients that stall: a body that stops arriving is answered (408, or 503
once SIGTERM came) instead of holding its connection and the shutdown forever."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette", reason="nmt serve needs the serve extra (make install installs it)")
pytest.importorskip("uvicorn", reason="nmt serve needs the serve extra (make install installs it)")

from nmt.serve.app import build_app  # noqa: E402
from nmt.serve.config import ServeConfig  # noqa: E402
from serve_helpers import Server  # noqa: E402
from test_translate import run_dir  # noqa: E402, F401  (fixture)

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
