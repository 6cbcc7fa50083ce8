"""The `nmt` entry point: registers the subcommands and turns user errors into one line."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import typer

from nmt.errors import Interrupted, NmtError
from nmt.os_errors import os_error_message
from nmt_cli import fast_exit

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


CHAIN = ("preprocess", "train", "average_checkpoints", "translate", "score", "export", "serve", "import")
"""The commands in the order a run uses them (module names: cli/cmd_NAME.py)."""


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"nmt {version('nmt')}")
        except PackageNotFoundError:  # a source tree that was never installed
            print("nmt (not installed)")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", "-V", help="Print nmt's version and exit.",
                                          is_eager=True, callback=_version)) -> None:
    """Neural machine translation with the Transformer of Vaswani et al. (2017)."""


def _reports_interrupts(callback: Callable[..., Any]) -> Callable[..., Any]:
    """Typer turns a KeyboardInterrupt into a silent exit 130 before `main` can see it, so each
    command's KeyboardInterrupt is carried out as `Interrupted` instead."""
    @functools.wraps(callback)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted() from None

    return command


def _register() -> None:
    """Import the command modules; each adds its command to `app`."""
    import importlib
    import pkgutil

    import nmt_cli

    names = [info.name[4:] for info in pkgutil.iter_modules(nmt_cli.__path__) if info.name.startswith("cmd_")]
    # `nmt --help` lists the chain first, in the order it runs, then the rest
    for name in sorted(names, key=lambda n: (CHAIN.index(n) if n in CHAIN else len(CHAIN), n)):
        importlib.import_module(f"nmt_cli.cmd_{name}").register(app)
    for command in app.registered_commands:
        command.callback = _reports_interrupts(command.callback)


_register()


def _fail(message: str, status: int) -> None:
    """One line on stderr, then exit; stdout is dropped so that flushing it at exit (a full
    disk, a closed pipe) cannot add a second message."""
    print(message, file=sys.stderr, flush=True)
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(status)


USAGE_ERROR: type[Exception] = typer.BadParameter.__bases__[0]
"""click's UsageError, whichever click typer runs on (recent typer vendors its own copy)."""


def main() -> None:
    """Console script: run the app; a user error is one line on stderr and exit status 1,
    Ctrl-C is "nmt: interrupted" and exit status 130."""
    try:
        try:
            code = app(standalone_mode=False)
            sys.exit(code if isinstance(code, int) else 0)
        except USAGE_ERROR as e:  # a value that does not parse, an unknown option: one line too
            command = e.ctx.command_path if e.ctx else "nmt"
            if not e.format_message():  # `nmt` alone: its help was the answer
                sys.exit(e.exit_code)
            _fail(f"nmt: error: {' '.join(e.format_message().split())} (see '{command} -h')", e.exit_code)
        except typer.Abort:
            raise KeyboardInterrupt from None
        except SystemExit as e:
            if e.code in (0, None):
                if not sys.stdout.closed:
                    sys.stdout.flush()  # here, not at exit, so a full disk is reported below
                fast_exit.exit_if_requested()
            raise
    except Interrupted as e:  # a command that saved its work first says what it saved
        _fail("nmt: interrupted" + (f": {e}" if str(e) else ""), e.exit_code)
    except NmtError as e:
        _fail(f"nmt: error: {e}", e.exit_code)
    except KeyboardInterrupt:
        _fail("nmt: interrupted", 130)
    except OSError as e:
        message = os_error_message(e)
        if message is None:
            raise
        _fail(f"nmt: error: {message}", 1)
