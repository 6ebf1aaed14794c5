"""Argument checks shared by the building blocks; errors name the argument, the expectation and the value."""
from __future__ import annotations


def check_positive_int(name: str, value, *, allow_none: bool = False) -> None:
    """Raise ``ValueError("{name}: expected a positive int[ or None], got {value!r}")`` unless it is one."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int{' or None' if allow_none else ''}, got {value!r}")
