"""`nmt serve`: a trained run over HTTP, with a page to try it in a browser."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any, Optional

import typer

from nmt_cli.common import CONTEXT, RunDirOption, engine_search
from nmt_cli.dataclass_options import dataclass_parameters, with_parameters

HELP = (
    "Serve a trained run over HTTP: POST /translate, GET /health, GET /info, and a page to try it at /.\n\n"
    "Uses the checkpoint(s) and translation settings of `nmt translate` (the beam search flags are the defaults "
    "a request may override with \"beam\", \"lenpen\" and \"nbest\"). Requests that arrive together share model calls. "
    "Listens on 127.0.0.1 unless --host says otherwise. SIGTERM or Ctrl-C answers the requests in flight that finish "
    "within --shutdown-grace-s (a 503 to the others and to those not started), then exits once the model call in "
    "progress ends."
)
NOT_FOR_SERVE = ("buffer_size", "encoding_errors")
"""`nmt translate` flags about reading an input stream, which a server does not have."""


def register(app: typer.Typer) -> None:
    from nmt.serve.config import ServeConfig
    from nmt.inference.config import SearchConfig, TranslateConfig

    serve_fields = [p.name for p in dataclass_parameters(ServeConfig)]
    params = [
        CONTEXT,
        inspect.Parameter("run_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RunDirOption),
        inspect.Parameter("checkpoint", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[list[str]], typer.Option("--checkpoint", "-c", show_default=False,
                                              help="Checkpoint file (or a name in RUN/checkpoints); repeat to ensemble.")]),
    ]
    params += dataclass_parameters(ServeConfig, panel=lambda _: "Server")
    params += dataclass_parameters(SearchConfig, panel=lambda _: "Beam search defaults (Section 6.1)")
    params += [p for p in dataclass_parameters(TranslateConfig, panel=lambda _: "Batching and device")
               if p.name not in NOT_FOR_SERVE]

    def serve_command(**kwargs: Any) -> None:
        from nmt.run.directory import resolve_run_dir
        from nmt.serve.app import serve

        run_dir = resolve_run_dir(kwargs.pop("run_dir"))
        checkpoints = kwargs.pop("checkpoint") or []
        cfg = ServeConfig(**{k: kwargs.pop(k) for k in serve_fields})
        note = engine_search(kwargs, kwargs.pop("ctx"))
        if note:
            print(f"nmt serve: {note}", file=sys.stderr)
        serve(run_dir, checkpoints, kwargs, cfg)

    app.command("serve", help=HELP)(with_parameters(serve_command, params))
