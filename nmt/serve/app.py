"""`nmt serve`: a trained run over HTTP (Starlette app, uvicorn server).

    POST /translate  {"text": "..." | ["...", ...], "beam": 4, "lenpen": 0.6, "nbest": 1,
                      "prefix": "..." | ["...", ...], "constraints": ["...", ...] | [["...", ...], ...],
                      "alignment": "hard" | "soft"}
                     -> {"translations": [{"text", "score", "nbest": [{"text", "score"}], "alignment"}],
                         "checkpoints": [{"path", "sha256"}], "settings": {...}, "time_ms": ...}
    GET  /health     -> {"status": "ok"}
    GET  /info       -> languages, architecture, parameters, checkpoints with hashes, settings,
                        limits, and batching counters (requests, sentences, model calls)
    GET  /           -> a page to type a sentence into and read its translation

It translates with `nmt.api.Model`, the engine of `nmt translate`, through `nmt.serve.batcher`, so
concurrent requests share model calls. Every error a client can cause is a 4xx with a JSON
{"error": "..."} of one line; anything else is a 500 with no details (the traceback goes to
the server's log only). On SIGTERM the server stops accepting connections and answers every
request it holds: a 503 at once to those still sending their body or not yet started, the
others translated if they finish within --shutdown-grace-s, else a 503; the model stops after
the call in progress, and the server exits 0. A request whose client went away is dropped: the
model never translates its sentences not yet in a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
import socket
import sys
import time
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from nmt.errors import NmtError
from nmt.serve.batcher import Batcher, ShuttingDown
from nmt.serve.config import ServeConfig
from nmt.inference.config import SearchConfig

log = logging.getLogger("nmt.serve.app")

REQUEST_FIELDS = {"text", "beam", "lenpen", "nbest", "prefix", "constraints", "alignment"}


class ClientError(Exception):
    """A request the server refuses: an HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


# -- request parsing (no web framework needed) ------------------------------------------

def parse_body(body: bytes, cfg: ServeConfig) -> tuple[list[Any], bool, dict[str, Any]]:
    """(sentences, whether "text" was a single string, beam search overrides), or ClientError.
    Each sentence is a (text, prefix, constraint phrases) triple."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClientError(400, f"the body is not valid UTF-8 (bad byte at offset {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClientError(400, f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise ClientError(400, "the body is not a request: its JSON is nested too deeply") from None
    except ValueError:  # Python refuses to read integers of more than 4300 digits
        raise ClientError(400, "the body is not a request: it holds a number with thousands of digits") from None
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
        raise ClientError(413, f"{len(lines)} sentences is more than this server takes at once "
                               f"(--max-lines {cfg.max_lines}); split the request")
    prefixes, phrases = _target_requests(data, lines, single)
    chars = sum(map(len, lines)) + sum(map(len, prefixes)) + sum(len(p) for line_phrases in phrases for p in line_phrases)
    if chars > cfg.max_chars:
        raise ClientError(413, f"{chars} characters (texts, prefixes and constraints) is more than this server takes "
                               f"at once (--max-chars {cfg.max_chars}); split the request")
    for i, (line, prefix, line_phrases) in enumerate(zip(lines, prefixes, phrases)):
        item = [] if single else [f"item {i}"]
        _refuse_lone_surrogates(line, "text", item)
        _refuse_lone_surrogates(prefix, "prefix", item)
        for j, phrase in enumerate(line_phrases):
            _refuse_lone_surrogates(phrase, "constraints", [*item, f"phrase {j}"])
        if len(line_phrases) > cfg.max_phrases:
            raise ClientError(400, f"{_field('constraints', item)} has {len(line_phrases)} phrases, more than this "
                                   f"server takes per sentence (--max-phrases {cfg.max_phrases})")
        if (phrase_chars := sum(map(len, line_phrases))) > cfg.max_phrase_chars:
            raise ClientError(400, f"{_field('constraints', item)} has {phrase_chars} characters, more than this "
                                   f"server takes per sentence (--max-phrase-chars {cfg.max_phrase_chars})")
    return list(zip(lines, prefixes, phrases)), single, _search_overrides(data, cfg)


def _refuse_lone_surrogates(value: str, name: str, where: list[str]) -> None:
    """A 400 here, not a 500 from deep inside the model call for every client sharing it."""
    from nmt.data.textio import lone_surrogate

    found = lone_surrogate(value)
    if found is not None:
        raise ClientError(400, f"{_field(name, where)} holds a lone surrogate {found}, which is no character; "
                               "send a whole surrogate pair")


def _field(name: str, where: list[str]) -> str:
    """A request field in a refusal: '"constraints" (item 2, phrase 0)'."""
    return f'"{name}" ({", ".join(where)})' if where else f'"{name}"'


def _target_requests(data: dict[str, Any], lines: list[str], single: bool) -> tuple[list[str], list[list[str]]]:
    """Each sentence's "prefix" and "constraints", shaped as "text" is (one per sentence)."""
    n = len(lines)
    prefixes, phrases = [""] * n, [[] for _ in range(n)]
    if "prefix" in data:
        value = data["prefix"]
        given = [value] if single and isinstance(value, str) else value
        if not isinstance(given, list) or len(given) != n or not all(isinstance(p, str) for p in given):
            want = "a string" if single else f"a list of {n} strings, one per text"
            raise ClientError(400, f'"prefix" must be {want} (empty: none), not {_json_type(value)}')
        prefixes = given
    if "constraints" in data:
        value = data["constraints"]
        given = [value] if single else value
        if not isinstance(given, list) or len(given) != n or not all(
                isinstance(c, list) and all(isinstance(p, str) for p in c) for c in given):
            want = "a list of strings" if single else f"a list of {n} lists of strings, one per text"
            raise ClientError(400, f'"constraints" must be {want}, not {_json_type(value)}')
        phrases = given
    return prefixes, phrases


def _columns(items: Sequence[tuple[str, str, list[str]]]) -> tuple[list[str], Optional[list[str]], Optional[list[list[str]]]]:
    """Texts, prefixes and constraint phrases of (text, prefix, phrases) sentences; None for
    prefixes or phrases that no sentence has."""
    texts, prefixes, phrases = (list(column) for column in zip(*items)) if items else ([], [], [])
    return texts, prefixes if any(prefixes) else None, phrases if any(phrases) else None


def _search_overrides(data: dict[str, Any], cfg: ServeConfig) -> dict[str, Any]:
    search: dict[str, Any] = {}
    for name in ("beam", "nbest"):
        if name in data:
            value = data[name]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ClientError(400, f'"{name}" must be an integer, not {_json_type(value)}')
            search[name] = value
    if "beam" in search and not 1 <= search["beam"] <= cfg.max_beam:
        raise ClientError(400, f'"beam" must be between 1 and {cfg.max_beam}, not {_shown(search["beam"])}')
    if "lenpen" in data:
        value = data["lenpen"]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ClientError(400, f'"lenpen" must be a number, not {_json_type(value)}')
        must = SearchConfig.RANGES["lenpen"].refusal(value)  # before float(), which overflows on a 400-digit int
        if must is not None:
            raise ClientError(400, f'"lenpen" must be {must}, not {_shown(value)}')
        search["lenpen"] = float(value)
    if "alignment" in data:
        value = data["alignment"]
        if value not in ("hard", "soft"):
            raise ClientError(400, f'"alignment" must be "hard" or "soft", not {_shown(value)}')
        search["alignment"] = value
    return search


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """A refused value in a message: a number as itself (cut short), anything else by its JSON type."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(value)
        return text if len(text) <= 24 else text[:21] + "..."
    return _json_type(value)


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
        with the model (see `nmt.serve.batcher`: a second computing thread halved CPU speed)."""
        self.cfg = cfg
        self.batcher = Batcher(self._translate, cfg.batch_window_ms / 1000.0, cfg.max_batch_sentences, init=load_model)
        self.model = self.batcher.wait_ready()
        self.checkpoints = [{"path": str(p), "sha256": file_sha256(p)} for p in self.model.checkpoints]
        self.runs_on = _runs_on(self.model.translator)
        self.architecture = _architecture(self.model)

    def _translate(self, items: Sequence[tuple[str, str, list[str]]], search: dict[str, Any]) -> list[Any]:
        texts, prefixes, phrases = _columns(items)
        return self.model.translate_lines(texts, prefixes, phrases, **search)

    def check_requests(self, items: Sequence[tuple[str, str, list[str]]], search: dict[str, Any]) -> None:
        """Refuse, before the batcher, a sentence whose prefix and constraints the model cannot
        take (a failing model call would fail the other clients' sentences of the call)."""
        texts, prefixes, phrases = _columns(items)
        if prefixes is None and phrases is None:
            return
        try:
            self.model.with_search(**search).check_requests(texts, prefixes, phrases)
        except NmtError as e:
            raise ClientError(400, str(e).replace("line ", "text ", 1).replace("--", "")) from None

    def settings(self, search: dict[str, Any]) -> dict[str, Any]:
        """The beam search used (defaults with the request's overrides) and where the model runs."""
        tr = self.model.translator
        return {**asdict(tr.search), **search, **self.runs_on, "max_tokens": tr.decoder.max_tokens,
                "threads": tr.cfg.threads, "inter_threads": tr.cfg.inter_threads}

    def check_search(self, search: dict[str, Any]) -> None:
        try:
            self.model.with_search(**search)
        except NmtError as e:
            raise ClientError(400, str(e).replace("--", "")) from None

    async def translate(self, lines: list[str], search: dict[str, Any], give_up: asyncio.Future) -> Optional[list[Any]]:
        """The translations of `lines`; None when `give_up` (the client went away, the shutdown's
        grace ended) comes first: then the batcher drops the request, and none of its sentences
        not yet in a model call is translated. ShuttingDown when the batcher takes no more work."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def done(found: Optional[list[Any]], error: Optional[BaseException]) -> None:
            loop.call_soon_threadsafe(_settle, future, found, error)

        ticket = self.batcher.submit(lines, search, done)
        try:
            await asyncio.wait({future, give_up}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when uvicorn cancels this request
            if not future.done():
                future.cancel()
                self.batcher.cancel(ticket)
        return None if future.cancelled() else future.result()

    def info(self) -> dict[str, Any]:
        from nmt.run.directory import RunDir
        from nmt.train.config import TrainConfig

        run = RunDir(self.model.run_dir)
        arch = None
        if run.has_record("train"):
            try:
                recorded = run.read_record("train").get("train_config")
                arch = TrainConfig.from_dict(recorded).model.arch if recorded else None
            except NmtError:
                arch = None
        model_cfg, parameters = self.architecture
        imported = run.read_record("preprocess").get("imported") if run.has_record("preprocess") else None
        return {
            "source_lang": self.model.source_lang,
            "target_lang": self.model.target_lang,
            "arch": arch,
            "imported": imported and {k: imported[k] for k in ("from", "folder", "weights", "weights_sha256")},
            "model": model_cfg,
            "parameters": parameters,
            "checkpoints": self.checkpoints,
            "settings": self.settings({}),
            "limits": {name: getattr(self.cfg, name) for name in (
                "max_chars", "max_lines", "max_beam", "max_phrases", "max_phrase_chars", "batch_window_ms",
                "max_batch_sentences", "shutdown_grace_s")},
            "stats": asdict(self.batcher.stats),
        }


def _runs_on(translator: Any) -> dict[str, str]:
    """The engine, device and number type that translate. A CTranslate2 translator holds no
    torch model to ask; its CTranslate2 engine says."""
    if translator.cfg.engine == "ctranslate2":
        engine = translator.decoder.engine
        device = engine.device if engine.device == "cpu" else f"{engine.device}:{engine.device_index[0]}"
        return {"engine": "ctranslate2", "device": device, "dtype": engine.compute_type, "decoder": "ctranslate2"}
    dtype = next(translator.models[0].parameters()).dtype
    return {"engine": "nmt", "device": str(translator.decoder.device), "dtype": str(dtype).replace("torch.", ""),
            "decoder": translator.decoder_path}


def _architecture(model: Any) -> tuple[dict[str, Any], int]:
    """(model configuration, parameters) of what translates. CTranslate2 runs without the
    torch model: its export record says (an older export's does not: then the checkpoint's
    configuration builds a model without weights)."""
    record = getattr(model.translator.decoder, "record", {})
    if "model" in record and "parameters" in record:
        return record["model"], int(record["parameters"])
    import torch

    from nmt.run.checkpoint import load_checkpoint
    from nmt.model.transformer import Transformer, count_parameters
    from nmt.model.config import TransformerConfig

    models = model.translator.models
    if not models:
        config = load_checkpoint(model.checkpoints[0], mmap=True)["config"]
        with torch.device("meta"):
            models = [Transformer(TransformerConfig.from_dict(config))]
    return models[0].cfg.to_dict(), sum(count_parameters(m) for m in models)


def _settle(future: asyncio.Future, found: Optional[list[Any]], error: Optional[BaseException]) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(found)


# -- the web app ------------------------------------------------------------------------

BODY_TIMEOUT_S = 30.0
"""A request body must arrive within this many seconds, or the request gets a 408: a client that
sends its headers and then stalls would otherwise hold its connection, and SIGTERM, forever.
The largest body a server takes by default (ServeConfig.max_body_bytes, 300 kB) needs 2.5 s at 1 Mbit/s."""

DRAIN_BYTES = 64 << 20
"""How much of a too large body is read and dropped before its 413. A client that sends the
whole body before it reads (Python's http.client, curl without Expect) gets a connection reset
instead of the 413 when the server closes the connection with its data unread."""

ANSWER_TIMEOUT_S = 10.0
"""After the shutdown's grace period every request is answered; uvicorn gives the answers this
long to be sent, then closes the connections, so a client that never reads its answer cannot
keep the server alive."""

SHUTTING_DOWN = "the server is shutting down; send the request again"


async def _receive_body(request: Any, limit: int) -> Optional[bytes]:
    """The body, or None when it is longer than `limit` bytes (read to its end, or DRAIN_BYTES past the limit)."""
    body = bytearray()
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received <= limit:
            body += chunk
        elif received > limit + DRAIN_BYTES:
            break
    return bytes(body) if received <= limit else None


async def _disconnected(request: Any) -> None:
    """Return once the client has closed its connection. After the body, uvicorn's `receive`
    waits for that (or for the answer to be sent)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(service: TranslationService, body_timeout: float = BODY_TIMEOUT_S) -> Any:
    """The Starlette app: routes, JSON errors, and the batcher closed at shutdown.
    `app.state.shut_down()` (at SIGTERM) starts the shutdown; setting `app.state.stopping`
    alone answers the requests still sending their bodies with a 503."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    page = resources.files("nmt.serve").joinpath("page.html").read_text(encoding="utf-8")
    stopping = asyncio.Event()
    out_of_time = asyncio.Event()

    def shut_down() -> None:
        """A 503 now to the bodies still arriving and the requests not started; the others have
        shutdown_grace_s to finish, then get a 503 too."""
        stopping.set()
        service.batcher.stop()
        asyncio.get_running_loop().call_later(service.cfg.shutdown_grace_s, out_of_time.set)

    async def read_body(request: Request) -> bytes:
        """The body: at most max_body_bytes (413), within `body_timeout` (408), unless SIGTERM comes first (503)."""
        limit = service.cfg.max_body_bytes
        too_big = ClientError(413, f"the body is larger than {limit} bytes; send at most {service.cfg.max_chars} characters")
        length = request.headers.get("content-length", "")
        declared = int(length) if length.isascii() and length.isdigit() else 0
        # Answered at once when the client waits for a go-ahead before it sends the body, or it is too big to read.
        if declared > limit and ("100-continue" in request.headers.get("expect", "").lower() or declared > limit + DRAIN_BYTES):
            raise too_big
        reading = asyncio.ensure_future(_receive_body(request, limit))
        stop = asyncio.ensure_future(stopping.wait())
        done, _ = await asyncio.wait({reading, stop}, timeout=body_timeout, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if reading not in done:
            reading.cancel()
            if stopping.is_set():
                raise ClientError(503, SHUTTING_DOWN)
            raise ClientError(408, f"the body did not arrive within {body_timeout:g} s")
        try:
            body = reading.result()
        except ClientDisconnect:
            raise ClientError(400, "the client closed the connection before the body arrived") from None  # no one reads it
        if body is None:
            raise too_big
        return body

    async def translate(request: Request) -> JSONResponse:
        start = time.perf_counter()
        try:
            lines, single, search = parse_body(await read_body(request), service.cfg)
            service.check_search(search)
            service.check_requests(lines, search)
        except ClientError as e:
            # After a 408 or 503 the rest of the body may still trickle in: close rather than wait for it.
            headers = {"connection": "close"} if e.status in (408, 503) else None
            return JSONResponse({"error": e.reason}, status_code=e.status, headers=headers)
        if await request.is_disconnected():  # gone while its body was parsed: no model work for no one
            return JSONResponse({"error": "the client closed the connection before its answer"}, status_code=400)
        give_up = asyncio.ensure_future(_first(_disconnected(request), out_of_time.wait()))
        try:
            found = await service.translate(lines, search, give_up)
        except ShuttingDown:
            found = None
        finally:
            give_up.cancel()
        if found is None:  # shutting down, or the client went away (then no one reads this)
            return JSONResponse({"error": SHUTTING_DOWN}, status_code=503, headers={"connection": "close"})
        return JSONResponse({
            "translations": [{"text": t.hyp, "score": t.score, "nbest": [{"text": h, "score": s} for h, s in t.nbest],
                              **({"alignment": t.alignment} if t.alignment is not None else {})} for t in found],
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

    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/translate", translate, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/info", info, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.stopping = stopping
    app.state.shut_down = shut_down
    return app


async def _first(*waits: Awaitable[Any]) -> None:
    """Return when the first of `waits` does; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def serve(run_dir: str | Path, checkpoints: Sequence[str | Path], settings: dict[str, Any], cfg: ServeConfig) -> None:
    """Load the run (as `nmt translate` does with the same settings) and serve it until SIGTERM or Ctrl-C."""
    cfg.validate(settings.get("beam"))
    try:
        import uvicorn
    except ImportError:
        raise NmtError("nmt serve needs its web packages: pip install 'nmt[serve]' (make install does)") from None
    from nmt.api import load

    # A server's model calls hold one batch each (at most --max-batch-sentences), so batches in
    # flight at once (--inter-threads) would leave cores idle: unless told otherwise, every
    # thread works on each call (with CTranslate2's inter_threads 2, 32 clients got less:
    # bench/results/2026-12-02_856633e_zen4_bench-serve.json).
    if not settings.get("inter_threads"):
        settings = {**settings, "inter_threads": 1}
    sock = listen_socket(cfg.host, cfg.port)  # a taken port fails before the model loads
    service = TranslationService(lambda: load(run_dir, list(checkpoints) or None, **settings), cfg)
    model = service.model
    app = build_app(service)

    class Server(uvicorn.Server):
        """uvicorn's server, telling the app when the shutdown begins."""

        async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
            app.state.shut_down()
            await super().shutdown(sockets)

    config = uvicorn.Config(app, access_log=False, log_level="warning",
                            timeout_graceful_shutdown=cfg.shutdown_grace_s + ANSWER_TIMEOUT_S, lifespan="on")
    server = Server(config)
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
