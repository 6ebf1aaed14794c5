"""Argument checks shared by the building blocks; errors name the argument, the expectation and the value."""
from __future__ import annotations

import contextlib
import math
import numbers

import torch

from hybrid.kernels.checks import as_int as _as_int
from hybrid.kernels.checks import check_positive_int  # noqa: F401 (one definition, for both layers)


# ------------------------------------------------------------------------------------------ numbers


def check_int(name: str, value, *, low: int | None = None, high: int | None = None,
              allow_none: bool = False, what: str | None = None) -> int | None:
    """``value`` as an int in ``[low, high]``, else ``ValueError("{name}: expected an int >= low…, got …")``.

    ``what`` replaces the generated description (e.g. "a positive int"); returns None when None is allowed.
    """
    if value is None and allow_none:
        return None
    n = _as_int(value)
    if n is None or (low is not None and n < low) or (high is not None and n > high):
        if what is None:
            bounds = [f">= {low}"] * (low is not None) + [f"<= {high}"] * (high is not None)
            what = "an int" + (" " + " and ".join(bounds) if bounds else "")
        raise ValueError(f"{name}: expected {what}{' or None' if allow_none else ''}, got {value!r}")
    return n


def check_even_dim(name: str, value, *, at_most: int | None = None, at_most_name: str = "head_dim") -> int:
    """A rotary dimension: an even int in ``[2, at_most]`` (pairs of channels rotate together)."""
    limit = "" if at_most is None else f", at most {at_most_name}={at_most}"
    n = _as_int(value)
    if n is None or n < 2 or n % 2 or (at_most is not None and n > at_most):
        raise ValueError(f"{name}: expected an even int >= 2 (rotary pairs){limit}, got {value!r}")
    return n


def check_number(name: str, value, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, allow_none: bool = False) -> float | None:
    """A finite real number in the given (open or closed) bounds, as a float; NaN and ±inf are refused."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        if low is not None and high is not None:
            what = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            what = f"a number {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            what = f"a number {'<' if high_open else '<='} {high:g}"
        else:
            what = "a finite number"
        raise ValueError(f"{name}: expected {what}{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def check_choice(name: str, value, choices) -> None:
    """``value`` is one of ``choices`` (a bool never stands for 1 or 0)."""
    listed = any(value is c if isinstance(value, bool) or isinstance(c, bool) else value == c for c in choices)
    if not isinstance(value, (str, int, float, type(None))) or not listed:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")


def check_bool(name: str, value) -> bool:
    """``value`` is True or False (not 0, 1 or a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ shapes


def check_heads(d_model, n_heads, head_dim=None) -> int:
    """The head size of ``n_heads`` heads over ``d_model``: ``head_dim``, or ``d_model // n_heads``, which then
    must divide exactly. Returns it (evenness, for rotary pairs, is the mixer's own check)."""
    check_positive_int("d_model", d_model)
    check_positive_int("n_heads", n_heads)
    if head_dim is not None:
        check_positive_int("head_dim", head_dim)
        return int(head_dim)
    if d_model % n_heads:
        raise ValueError(f"n_heads: expected a divisor of d_model={d_model} (or set head_dim), got {n_heads}")
    return int(d_model) // int(n_heads)


def check_rotary_base(name: str, value) -> float:
    """A rotary base: a finite number > 1 (at or below 1 the frequencies base^(−2i/d) would not decay: no
    slow pairs, no long-range positions)."""
    return check_number(name, value, low=1, low_open=True)


# ------------------------------------------------------------------------------------------ tensors

_RECORDING = [False]


@contextlib.contextmanager
def recording_graph():
    """While a decode step is recorded as a graph (`models/decoding/graphed_step.py`): no check reads a tensor
    back, on any device. A read back is a host sync, which a CUDA graph cannot hold, and its value would be fixed
    at the recording (the CPU stand-in of a CUDA graph records on the CPU)."""
    before, _RECORDING[0] = _RECORDING[0], True
    try:
        yield
    finally:
        _RECORDING[0] = before


def reads_back(x: torch.Tensor) -> bool:
    """A check may read ``x`` back to the host: on the CPU, outside ``torch.compile`` and graph recording (else it
    asserts on the device, or checks nothing)."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling() and not _RECORDING[0]


def check_float_tensor(name: str, x, dtypes=None) -> None:
    """``x`` is a floating-point tensor (of one of ``dtypes`` when given)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a float tensor, got {type(x).__name__}")
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name}: expected a tensor of dtype {names}, got {str(x.dtype).removeprefix('torch.')}")
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a float tensor, got dtype {str(x.dtype).removeprefix('torch.')}")


def check_finite(name: str, x: torch.Tensor) -> None:
    """No NaN / ±inf in ``x``. On the CPU a ValueError; on an accelerator (or while compiling) an
    asynchronous device assertion, so the check costs no host synchronisation."""
    if not reads_back(x):
        torch._assert_async(torch.isfinite(x).all(), f"{name}: expected finite values, got NaN or inf")
    elif not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: expected finite values, got {_nonfinite_summary(x)}")


def _nonfinite_summary(x: torch.Tensor) -> str:
    n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    parts = [f"{n_nan} NaN"] * bool(n_nan) + [f"{n_inf} inf"] * bool(n_inf)
    return " and ".join(parts) + f" among {x.numel()} values"


def check_input_dtype(name: str, x: torch.Tensor, param_dtype: torch.dtype) -> None:
    """``x`` has the module's parameter dtype (any dtype under autocast, which casts per op)."""
    if x.dtype != param_dtype and not torch.is_autocast_enabled(x.device.type):
        p, g = str(param_dtype).removeprefix("torch."), str(x.dtype).removeprefix("torch.")
        raise ValueError(f"{name}: expected dtype {p} (the module's parameters; convert the module with "
                         f".to(torch.{g}) or the input with .to(torch.{p})), got {g}")


def check_sequence_states(states, n_sequences: int, check_one, what: str = "states") -> list | None:
    """The per-sequence states of a packed call (``cu_seqlens``): None, or a list of ``n_sequences`` entries,
    each None (a fresh sequence) or a state that ``check_one(state)`` accepts (it raises otherwise). Returns
    None when every entry is None."""
    if states is None:
        return None
    if not isinstance(states, (list, tuple)) or len(states) != n_sequences:
        got = f"a list of {len(states)}" if isinstance(states, (list, tuple)) else type(states).__name__
        raise ValueError(f"state: expected None or a list of N={n_sequences} per-sequence {what} with cu_seqlens, "
                         f"got {got}")
    for state in states:
        if state is not None:
            check_one(state)
    return None if all(state is None for state in states) else list(states)

