"""The field checks that TrainConfig and DistillConfig share, in the one error style ("name: expected …, got …").

Integers go through ``hybrid.checks.check_int`` directly; these add what a training config needs beyond it.
"""
from __future__ import annotations

from hybrid.checks import check_number

from ..output.tracking import TRACKERS

__all__ = ["check_real", "check_fraction", "check_betas", "tracker_list", "check_text_column", "check_optional_str"]


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
    """A number strictly between 0 and 1 (a held-out fraction)."""
    check_real(name, value, low=0.0, high=1.0, low_open=True)
    if value >= 1.0:
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
