"""The fields of every settings dataclass and the range of each numeric one: one home for both.

`setting(default, help)` declares a field with its help text, from which the CLI builds the
flag and its `--help` line (`nmt_cli.dataclass_options`); every settings class (model, train,
preprocess, translate, sampling, serve) declares its fields with it.

The range of every numeric setting is declared in one table per settings class; one rule checks
them all. Comparisons such as `x < 0` let NaN through and Python ints have no size limit, so ad-hoc
checks in each `validate()` missed `--adam-eps nan` or `--max-tokens 10**30`, which then failed
deep inside torch or numpy. Instead each settings dataclass declares the `Range` of every
int and float field in one table beside its `validate()` (`RANGES`), and `check_ranges` refuses
a value that is not a number of the field's type, not finite, or outside it, naming the flag
and the limit. A value with a meaning outside the plain range is part of it (--keep-last -1:
keep all). Cross-field rules (--nbest <= --beam) stay in each `validate()`.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

from nmt.errors import NmtError


def setting(default: Any, help: str) -> Any:
    """A settings field: its default, and the help text its flag's `--help` shows."""
    return field(default=default, metadata={"help": help})


INT32_MAX = 2**31 - 1
"""The ceiling of counts unless a field says less: what torch's int32 indices and C ints hold."""
MAX_THREADS = 1024
"""CPU threads and processes: more than any machine has, less than what makes torch or the OS fail."""


@dataclass(frozen=True)
class Range:
    """low <= x <= high; an open end excludes its bound: (0, 1] is Range(0, 1, low_open=True)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"

    def refusal(self, value: float) -> Optional[str]:
        """What `value` must be instead, or None when it is inside (NaN never is)."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"a finite number in {self}"
        if value < self.low or (self.low_open and value == self.low):
            return f"{'more than' if self.low_open else 'at least'} {_num(self.low)}"
        if value > self.high or (self.high_open and value == self.high):
            return f"{'less than' if self.high_open else 'at most'} {_num(self.high)}"
        return None


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


COUNT = Range(0, INT32_MAX)
"""A count where 0 means off or no limit."""
COUNT_OR_ALL = Range(-1, INT32_MAX)
"""A count of things to keep, or -1 to keep them all (--keep-last)."""
POSITIVE = Range(1, INT32_MAX)
"""A count of at least one."""
FRACTION = Range(0.0, 1.0, high_open=True)
"""A probability that must leave something: dropout, label smoothing, Adam's betas."""
NON_NEGATIVE = Range(0.0, math.inf, high_open=True)
"""A finite amount, 0 included (0 usually means off)."""
POSITIVE_REAL = Range(0.0, math.inf, low_open=True, high_open=True)
"""A finite amount above 0."""
SEED = Range(0, 2**32 - 1)
"""What numpy's generators and torch.manual_seed both accept."""
THREADS = Range(0, MAX_THREADS)
"""Threads or processes; 0 means the default (one per core)."""


def check_ranges(settings: Any, ranges: Optional[Mapping[str, Range]] = None) -> None:
    """Refuse any numeric field of `settings` outside its range (default: its class's `RANGES`),
    naming its flag. None passes where the field is optional (unset: a default applies)."""
    ranges = type(settings).RANGES if ranges is None else ranges
    hints = typing.get_type_hints(type(settings))
    for f in fields(settings):
        value, types = getattr(settings, f.name), (hints[f.name], *typing.get_args(hints[f.name]))
        if f.name in ranges:
            check_value(f.name, value, ranges[f.name], integer=int in types, optional=type(None) in types)


def check_value(name: str, value: Any, range_: Range, integer: Optional[bool] = None, optional: bool = True) -> None:
    """Refuse one setting `name` outside `range_`, naming its flag; None passes when the setting
    is `optional` (unset: a default applies). An int range's value must be an int unless
    `integer` says otherwise."""
    if value is None and optional:
        return
    integer = isinstance(range_.low, int) and isinstance(range_.high, int) if integer is None else integer
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        must: Optional[str] = "an integer" if integer else "a number"
    else:
        must = range_.refusal(value)
    if must is not None:
        raise NmtError(f"--{name.replace('_', '-')} must be {must}, not {value!r}")
