"""The `nmt` entry point: registers the subcommands and turns user errors into one line."""

from __future__ import annotations

import sys

import typer

from nmt.errors import Interrupted, NmtError

app = typer.Typer(
    name="nmt",
    help="Neural machine translation with the Transformer of Vaswani et al. (2017).\n\n"
    "The chain: preprocess -> train -> average-checkpoints -> translate -> score, "
    "each reading and writing one run directory (--run-dir/-r, default $NMT_RUN_DIR or '.').",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    """Import the command modules; each adds its command to `app`."""
    import importlib
    import pkgutil

    import nmt_cli

    for info in sorted(pkgutil.iter_modules(nmt_cli.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            module = importlib.import_module(f"nmt_cli.{info.name}")
            module.register(app)


_register()


def main() -> None:
    """Console script: run the app; a user error is one line on stderr and exit status 1."""
    try:
        app()
    except Interrupted as e:
        print(f"nmt: interrupted: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except NmtError as e:
        print(f"nmt: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("nmt: interrupted", file=sys.stderr)
        sys.exit(130)
