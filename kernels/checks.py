"""Argument checks the ops share (the building blocks re-export them from ``hybrid.checks``): one-line errors
naming the argument, the expectation and the value."""
from __future__ import annotations

import operator


def check_positive_int(name: str, value, *, allow_none: bool = False) -> None:
    """Raise ``ValueError("{name}: expected a positive int[ or None], got {value!r}")`` unless it is one."""
    if value is None and allow_none:
        return
    n = as_int(value)  # ints, numpy ints, 0-dim integer tensors; never bools
    if n is None or n < 1:
        raise ValueError(f"{name}: expected a positive int{' or None' if allow_none else ''}, got {value!r}")


def as_int(value):
    """``int(value)`` for ints, numpy ints and 0-dim integer tensors; None for anything else (bools too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):  # first: under torch.compile a dynamic size is an int here, and has no ndim
        return value
    if getattr(value, "ndim", 0) != 0:  # a 1-element tensor or array is not an int
        return None
    try:
        return int(operator.index(value))
    except TypeError:
        return None
