"""`nmt serve`: a trained run over HTTP (Starlette app, uvicorn server).

    POST /translate  {"text": "..." | ["...", ...], "beam": 4, "lenpen": 0.6, "nbest": 1}
                     -> {"translations": [{"text", "score", "nbest": [{"text", "score"}]}],
                         "checkpoints": [{"path", "sha256"}], "settings": {...}, "time_ms": ...}
    GET  /health     -> {"status": "ok"}
    GET  /info       -> languages, architecture, parameters, checkpoints with hashes, settings,
                        limits, and batching counters (requests, sentences, model calls)
    GET  /           -> a page to type a sentence into and read its translation

It translates with `nmt.api.Model`, the engine of `nmt translate`, through `nmt.batcher`, so
concurrent requests share model calls. Every error a client can cause is a 4xx with a JSON
{"error": "..."} of one line; anything else is a 500 with no details (the traceback goes to
the server's log only). On SIGTERM the server stops accepting connections, answers the
requests it holds, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import signal
import socket
import sys
import time
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from nmt.errors import NmtError
from nmt.serve_config import ServeConfig

log = logging.getLogger("nmt.serve")

REQUEST_FIELDS = {"text", "beam", "lenpen", "nbest"}


class ClientError(Exception):
    """A request the server refuses: an HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


# -- request parsing (no web framework needed) ------------------------------------------

def parse_body(body: bytes, cfg: ServeConfig) -> tuple[list[str], bool, dict[str, Any]]:
    """(sentences, whether "text" was a single string, beam search overrides), or ClientError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClientError(400, f"the body is not valid UTF-8 (bad byte at offset {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClientError(400, f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, dict):
        raise ClientError(400, f'the body must be a JSON object like {{"text": "..."}}, not a JSON {_json_type(data)}')
    unknown = sorted(set(data) - REQUEST_FIELDS)
    if unknown:
        raise ClientError(400, f"unknown field(s) {', '.join(map(repr, unknown))}; use {', '.join(sorted(REQUEST_FIELDS))}")
    if "text" not in data:
        raise ClientError(400, 'missing field "text": a string or a list of strings')
    text_value = data["text"]
    single = isinstance(text_value, str)
    lines = [text_value] if single else text_value
    if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
        raise ClientError(400, f'"text" must be a string or a list of strings, not {_json_type(text_value)}'
                               + (" with other items" if isinstance(lines, list) else ""))
    if len(lines) > cfg.max_lines:
        raise ClientError(413, f"{len(lines)} sentences is more than this server takes at once ({cfg.max_lines}); split the request")
    chars = sum(map(len, lines))
    if chars > cfg.max_chars:
        raise ClientError(413, f"{chars} characters is more than this server takes at once ({cfg.max_chars}); split the request")
    return lines, single, _search_overrides(data, cfg)


def _search_overrides(data: dict[str, Any], cfg: ServeConfig) -> dict[str, Any]:
    search: dict[str, Any] = {}
    for name in ("beam", "nbest"):
        if name in data:
            value = data[name]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ClientError(400, f'"{name}" must be an integer, not {_json_type(value)}')
            search[name] = value
    if "beam" in search and not 1 <= search["beam"] <= cfg.max_beam:
        raise ClientError(400, f'"beam" must be between 1 and {cfg.max_beam}, not {search["beam"]}')
    if "lenpen" in data:
        value = data["lenpen"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ClientError(400, f'"lenpen" must be a finite number, not {_json_type(value)}')
        search["lenpen"] = float(value)
    return search


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# -- the service: model, batcher, provenance --------------------------------------------

class TranslationService:
    """The loaded model behind the batcher, plus what /info and each answer report about it."""

    def __init__(self, load_model: Callable[[], Any], cfg: ServeConfig):
        """`load_model` runs on the batcher's worker thread, the one thread that ever computes
        with the model (see `nmt.batcher`: a second computing thread halved CPU speed)."""
        from nmt.batcher import Batcher

        self.cfg = cfg
        self.batcher = Batcher(self._translate, cfg.batch_window_ms / 1000.0, cfg.max_batch_sentences, init=load_model)
        self.model = self.batcher.wait_ready()
        self.checkpoints = [{"path": str(p), "sha256": file_sha256(p)} for p in self.model.checkpoints]

    def _translate(self, lines: Sequence[str], search: dict[str, Any]) -> list[Any]:
        return self.model.with_search(**search).translate(lines)

    def settings(self, search: dict[str, Any]) -> dict[str, Any]:
        """The beam search used (defaults with the request's overrides) and where the model runs."""
        tr = self.model.translator
        return {**asdict(tr.search), **search, "device": str(tr.device),
                "dtype": str(next(tr.models[0].parameters()).dtype).replace("torch.", ""),
                "max_tokens": tr.cfg.max_tokens}

    def check_search(self, search: dict[str, Any]) -> None:
        try:
            self.model.with_search(**search)
        except NmtError as e:
            raise ClientError(400, str(e).replace("--", "")) from None

    async def translate(self, lines: list[str], search: dict[str, Any]) -> list[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def done(found: Optional[list[Any]], error: Optional[BaseException]) -> None:
            loop.call_soon_threadsafe(_settle, future, found, error)

        self.batcher.submit(lines, search, done)
        return await future

    def info(self) -> dict[str, Any]:
        from nmt.model import count_parameters
        from nmt.rundir import RunDir
        from nmt.train_config import TrainConfig

        run = RunDir(self.model.run_dir)
        arch = None
        if run.has_record("train"):
            try:
                recorded = run.read_record("train").get("train_config")
                arch = TrainConfig.from_dict(recorded).model.arch if recorded else None
            except NmtError:
                arch = None
        models = self.model.translator.models
        return {
            "source_lang": self.model.source_lang,
            "target_lang": self.model.target_lang,
            "arch": arch,
            "model": models[0].cfg.to_dict(),
            "parameters": sum(count_parameters(m) for m in models),
            "checkpoints": self.checkpoints,
            "settings": self.settings({}),
            "limits": {"max_chars": self.cfg.max_chars, "max_lines": self.cfg.max_lines, "max_beam": self.cfg.max_beam,
                       "batch_window_ms": self.cfg.batch_window_ms, "max_batch_sentences": self.cfg.max_batch_sentences},
            "stats": asdict(self.batcher.stats),
        }


def _settle(future: asyncio.Future, found: Optional[list[Any]], error: Optional[BaseException]) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(found)


# -- the web app ------------------------------------------------------------------------

def build_app(service: TranslationService) -> Any:
    """The Starlette app: routes, JSON errors, and the batcher closed at shutdown."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    page = resources.files("nmt").joinpath("serve_page.html").read_text(encoding="utf-8")

    async def read_body(request: Request) -> bytes:
        limit = service.cfg.max_body_bytes
        too_big = ClientError(413, f"the body is larger than {limit} bytes; send at most {service.cfg.max_chars} characters")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
        return bytes(body)

    async def translate(request: Request) -> JSONResponse:
        start = time.perf_counter()
        try:
            lines, single, search = parse_body(await read_body(request), service.cfg)
            service.check_search(search)
        except ClientError as e:
            return JSONResponse({"error": e.reason}, status_code=e.status)
        found = await service.translate(lines, search)
        return JSONResponse({
            "translations": [{"text": t.hyp, "score": t.score, "nbest": [{"text": h, "score": s} for h, s in t.nbest]}
                             for t in found],
            "checkpoints": service.checkpoints,
            "settings": service.settings(search),
            "time_ms": round((time.perf_counter() - start) * 1000, 3),
        })

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def info(_: Request) -> JSONResponse:
        return JSONResponse(service.info())

    async def index(_: Request) -> HTMLResponse:
        return HTMLResponse(page)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.batcher.close)  # after uvicorn answered the requests in flight

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal error; the server log has the details"}, status_code=500)

    return Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/translate", translate, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/info", info, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )


def serve(run_dir: str | Path, checkpoints: Sequence[str | Path], settings: dict[str, Any], cfg: ServeConfig) -> None:
    """Load the run (as `nmt translate` does with the same settings) and serve it until SIGTERM or Ctrl-C."""
    cfg.validate()
    try:
        import uvicorn
    except ImportError:
        raise NmtError("nmt serve needs its web packages: pip install 'nmt[serve]' (make install does)") from None
    from nmt.api import load

    sock = listen_socket(cfg.host, cfg.port)  # a taken port fails before the model loads
    service = TranslationService(lambda: load(run_dir, list(checkpoints) or None, **settings), cfg)
    model = service.model
    config = uvicorn.Config(build_app(service), access_log=False, log_level="warning",
                            timeout_graceful_shutdown=None, lifespan="on")
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"nmt serve: {model.source_lang}->{model.target_lang} with {', '.join(map(str, model.checkpoints))} "
          f"on {url} (Ctrl-C or SIGTERM to stop)", file=sys.stderr, flush=True)
    # uvicorn re-raises the SIGTERM it handled once it has drained; a handler that does
    # nothing turns that into a normal return, so a drained shutdown exits 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        service.batcher.close()
    print("nmt serve: stopped", file=sys.stderr, flush=True)


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for `host`:`port` (port 0: any free port), or a one-line error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # from now on clients queue up instead of being refused
    except OSError as e:
        raise NmtError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port or --host") from None
    return sock
