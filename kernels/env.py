"""The kernels' environment variables: one naming scheme, read in one place.

    HYBRID_<OP>_BACKEND   the backend an op runs when the call names none: "auto" (the default) or one of its own
        HYBRID_SCAN_BACKEND     complex_scan       auto | triton | cpu | torch | reference
        HYBRID_WINDOW_BACKEND   window_attention   auto | flash | flex | blocked | reference
        HYBRID_CONV_BACKEND     causal_conv1d      auto | causal_conv1d | torch | reference
        HYBRID_GLA_BACKEND      vo_gla             auto | fla | torch | reference
    HYBRID_<OP>_<KNOB>    any other setting of an op (read once, when the Triton scan is imported)
        HYBRID_SCAN_AUTOTUNE    1 | 0: autotune the Triton scan's tiles on large problems
        HYBRID_SCAN_SHIFT       gather | load: how the Triton backward reads a_{t+1} (A/B timing)
        HYBRID_SCAN_LAYOUT      runs | tile: how the Triton scan spreads a time tile over threads (A/B timing)
        HYBRID_SCAN_STAGES      3 | 1 | 2 | 4: software pipelining of the runs layout's loop (1: none)
        HYBRID_SCAN_SPLIT       auto | off: split few long rows in time on a GPU (complex_scan/time_split.py)

Retention has one way of computing it (the reference is for tests), so it has no variable. A backend named in
the call wins over the variable. Values are stripped and lower-cased; an empty one counts as unset.

Old names still work, each with one ``FutureWarning`` naming its successor: ``HYBRID_BACKEND`` (now
``HYBRID_SCAN_BACKEND``) and ``HYBRID_CPU_SCAN=0`` (now ``HYBRID_SCAN_BACKEND=torch``; the old variable keeps
its narrower effect of turning off only the compiled CPU scan).
"""
from __future__ import annotations

import os
import warnings

__all__ = ["read_env", "read_deprecated"]

_warned: set[str] = set()  # the deprecated names already warned about in this process


def read_deprecated(old: str, instead: str) -> str | None:
    """The value of the deprecated variable ``$old``, stripped (None when unset or empty). The first time it is
    found set in this process, a ``FutureWarning`` saying to use ``instead``."""
    value = _value(old)
    if value is not None and old not in _warned:
        _warned.add(old)
        warnings.warn(f"${old} is deprecated: use {instead} instead", FutureWarning, stacklevel=3)
    return value


def read_env(name: str, choices: tuple[str, ...], default: str, *, old: str | None = None) -> str:
    """``$name`` (stripped, lower-cased) if set, else the deprecated ``$old`` (see ``read_deprecated``), else
    ``default``. A value outside ``choices`` is a one-line ``ValueError`` naming the variable that held it."""
    source, value = name, _value(name)
    if old is not None:
        old_value = read_deprecated(old, f"${name}")  # warns even when $name is set (and wins)
        if value is None:
            source, value = old, old_value
    if value is None:
        return default
    if value.lower() not in choices:
        raise ValueError(f"{source}: expected one of {choices}, got {value!r}")
    return value.lower()


def _value(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None
