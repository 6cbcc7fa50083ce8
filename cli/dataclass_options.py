"""Turn a settings dataclass into typer options, so the dataclass is the one source of truth
for each flag's name, default and help."""

from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Callable, Optional

import typer


def _base_type(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def dataclass_parameters(cls: type, panel: Callable[[str], str] | None = None,
                         as_text: tuple[str, ...] = (), rename: dict[str, str] | None = None,
                         short: dict[str, str] | None = None,
                         aliases: dict[str, tuple[str, ...]] | None = None) -> list[inspect.Parameter]:
    """One keyword parameter per field: `--field-name`, its default and its help text.

    A field that is itself a dataclass (TrainConfig.model) gives its fields' parameters, flat:
    the caller nests them again (`TrainConfig.from_dict`). Fields named in `as_text` are taken
    as strings (parsed by the caller, e.g. durations); `short` gives fields a short option too
    (`{"workers": "-j"}`), `aliases` more long names (fairseq's, where the meaning is the same:
    `{"warmup": ("--warmup-updates",)}`). A boolean is a `--x/--no-x` pair.
    """
    hints = typing.get_type_hints(cls)
    params = []
    for f in fields(cls):
        tp = _base_type(hints[f.name])
        if is_dataclass(tp):
            params += dataclass_parameters(tp, panel, as_text, rename, short, aliases)
            continue
        flag = "--" + (rename or {}).get(f.name, f.name).replace("_", "-")
        extra = [*((aliases or {}).get(f.name, ())), *([short[f.name]] if short and f.name in short else [])]
        default = f.default if f.default is not MISSING else None
        kwargs: dict[str, Any] = {"help": f.metadata.get("help", ""), "show_default": default is not None}
        if panel is not None:
            kwargs["rich_help_panel"] = panel(f.name)
        if f.name in as_text:
            tp, default = Optional[str], (None if not default else str(default))
        elif tp is bool:
            no_flag = "--no-" + flag[2:]
            decls = [f"{flag}/{no_flag}", *extra]
            tp = Optional[bool] if default is None else bool
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=typing.Annotated[tp, typer.Option(*decls, **kwargs)]))
            continue
        else:
            tp = Optional[tp] if default is None else tp
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=typing.Annotated[tp, typer.Option(flag, *extra, **kwargs)]))
    return params


def with_parameters(fn: Callable[..., Any], params: list[inspect.Parameter]) -> Callable[..., Any]:
    """Give `fn(**kwargs)` an explicit signature so typer builds options from it."""
    fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return fn
