"""The checks of the run configs' options, in the one error style (``name: expected …, got …``): each a callable
``check(name, value) -> the value as kept``, named by a field's ``Option`` (``hybrid.train.options.fields``).

The checks that bound a number (``Whole``, ``Real``) or pick among names (``OneOf``) are objects that say their
rule, so a command line reads its flag's text by the same rule (``hybrid.train.cli.flags``); the others check what
only a config holds (a dict of overrides, a list of trackers, a path).
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid.checks import check_int, check_number

from ..output.tracking import TRACKERS
from ..parallel.device import check_device

__all__ = ["Whole", "Real", "OneOf", "OfType", "whole", "optional_whole", "real", "one_of", "a_bool", "a_path", "a_dict",
           "overrides", "clip", "check_real", "check_fraction", "check_betas", "tracker_list", "check_text_column",
           "check_optional_str", "check_device"]


@dataclass(frozen=True)
class Whole:
    """An int >= ``low`` (or None, when ``none_word`` names it on a command line: ``--eval-batches all``)."""

    low: int
    none_word: str | None = None
    allow_none: bool = False

    def __call__(self, name: str, value):
        if value is None and (self.allow_none or self.none_word is not None):
            return None
        return check_int(name, value, low=self.low)


@dataclass(frozen=True)
class Real:
    """A finite number in ``[low, high]`` (``(low, …`` when ``low_open``); ``or_else`` adds to the expectation;
    ``strict``: a command line refuses a value outside as it parses it (else the config does)."""

    low: float
    high: float | None = None
    low_open: bool = False
    or_else: str = ""
    strict: bool = False

    def __call__(self, name: str, value):
        return check_real(name, value, low=self.low, high=self.high, low_open=self.low_open, or_else=self.or_else)


@dataclass(frozen=True)
class OneOf:
    choices: tuple

    def __call__(self, name: str, value):
        if value not in self.choices:
            raise ValueError(f"{name}: expected one of {list(self.choices)}, got {value!r}")
        return value


def whole(low: int) -> Whole:
    return Whole(low)


def optional_whole(low: int, none_word: str | None = None) -> Whole:
    return Whole(low, none_word=none_word, allow_none=True)


def real(low: float, high: float | None = None, *, low_open: bool = False, strict: bool = False) -> Real:
    return Real(low, high, low_open, strict=strict)


def one_of(choices) -> OneOf:
    return OneOf(tuple(choices))


def check_real(name: str, value, *, low: float, high: float | None = None, low_open: bool = False,
               or_else: str = "") -> float:
    """A finite number in ``[low, high]`` (``(low, …`` when ``low_open``). With no upper bound the message says
    "a finite number > 0", never a range such as "(0, inf]" that inf would seem to be in. ``or_else`` is added
    to the expectation (", or 0 for none")."""
    try:
        return check_number(name, value, low=low, high=high, low_open=low_open)
    except ValueError:
        what = (f"a finite number {'>' if low_open else '>='} {low:g}" if high is None
                else f"a number in {'(' if low_open else '['}{low:g}, {high:g}]")
        raise ValueError(f"{name}: expected {what}{or_else}, got {value!r}") from None


def check_fraction(name: str, value) -> float:
    """A number strictly between 0 and 1 (a held-out fraction); one message, "in (0, 1)", for every value outside."""
    try:
        check_real(name, value, low=0.0, high=1.0, low_open=True)
    except ValueError:
        value_ok = False
    else:
        value_ok = value < 1.0
    if not value_ok:
        raise ValueError(f"{name}: expected a number in (0, 1), got {value!r}")
    return float(value)


def check_betas(name: str, value) -> tuple:
    """AdamW's two betas, each in [0, 1); a list becomes a tuple."""
    value = tuple(value) if isinstance(value, list) else value
    if (not isinstance(value, tuple) or len(value) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in value)):
        raise ValueError(f"{name}: expected two numbers in [0, 1), got {value!r}")
    return value


def tracker_list(name: str, value) -> list:
    """Distinct experiment trackers from TRACKERS, as a list (a single name or a tuple is accepted)."""
    if isinstance(value, (tuple, str)):
        value = [value] if isinstance(value, str) else list(value)
    if not isinstance(value, list) or any(k not in TRACKERS for k in value) or len(set(value)) != len(value):
        raise ValueError(f"{name}: expected a list of distinct trackers from {list(TRACKERS)}, got {value!r}")
    return value


def check_text_column(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a column name, got {value!r}")
    return value


def check_optional_str(name: str, value) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name}: expected a string or None, got {value!r}")
    return value



@dataclass(frozen=True)
class OfType:
    """A value of ``kind`` (a non-empty one for ``str``): else ``name: expected {what}, got …``, the value or, with
    ``name_the_type``, its type's name."""

    kind: type
    what: str
    name_the_type: bool = False

    def __call__(self, name: str, value):
        if not isinstance(value, self.kind) or (self.kind is str and not value):
            got = type(value).__name__ if self.name_the_type else repr(value)
            raise ValueError(f"{name}: expected {self.what}, got {got}")
        return value


a_bool = OfType(bool, "True or False")
a_path = OfType(str, "a directory path")
a_dict = OfType(dict, "a dict", name_the_type=True)
overrides = OfType(dict, "a dict of HybridConfig overrides", name_the_type=True)  # the model config checks values


def clip(name: str, value) -> float | None:
    """A gradient-norm bound: a finite number > 0, or 0 / None for no clipping (kept as None)."""
    if value is None or (value == 0 and not isinstance(value, bool)):
        return None
    return check_real(name, value, low=0.0, low_open=True, or_else=", or 0 (or None) for no clipping")
