"""Argument checks shared by the retention forms: one line each, ``name: expected …, got …``.

``check_cu_seqlens`` is the shared one of every op (``hybrid.kernels.varlen``): its value checks read the
offsets back (one device sync) and are skipped while ``torch.compile`` traces. The static checks (shapes,
dtypes, devices) always run: they cost nothing and trace cleanly; the decay's values (``check_decay_values``) are
read back once unless the caller says they are right by construction (``check_values=False``, the model's).
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..matrix_state import (FLOAT_DTYPES, bad_decay_error, check_state, check_tile_size,  # noqa: F401
                            decay_out_of_range, state_dtype)
from ..varlen import check_cu_seqlens as _check_cu_seqlens




def check_qkv(q, k, v, log_decay) -> None:
    """q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)``, log_decay ``(H,)``, all floating, on one device."""
    for name, x in (("q", q), ("k", k), ("v", v), ("log_decay", log_decay)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name}: expected a floating dtype, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: expected a tensor on {q.device} (the device of q), got {x.device}")
    if q.dim() != 4:
        raise ValueError(f"q: expected shape (B, T, H, Dk), got {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k: expected shape {tuple(q.shape)} (the shape of q), got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v: expected shape {tuple(q.shape[:3])} + (Dv,), got {tuple(v.shape)}")
    if log_decay.shape != (q.shape[2],):
        raise ValueError(f"log_decay: expected shape ({q.shape[2]},), got {tuple(log_decay.shape)}")


def check_decay_values(log_decay: Tensor) -> None:
    """``log_decay`` finite and ≤ 0 (NaN, +inf and −inf refused: γ^0 of a decay of 0 is undefined in the closed
    forms): one host sync, none while torch.compile traces."""
    if torch.compiler.is_compiling():
        return
    if decay_out_of_range(log_decay).item():
        raise bad_decay_error(log_decay)


def decay_argument(log_decay, log_gamma, op: str) -> Tensor:
    """``log_decay``, or ``log_gamma``: its name before every op called the decay the same (the retention ops were
    public under it, so it still works, with a DeprecationWarning)."""
    if log_gamma is not None:
        if log_decay is not None:
            raise TypeError(f"{op}: expected log_decay only (log_gamma is its old name), got both")
        warnings.warn(f"{op}: log_gamma is now log_decay (the name every op uses)", DeprecationWarning, stacklevel=3)
        return log_gamma
    if log_decay is None:
        raise TypeError(f"{op}: expected log_decay, the per-head log decay (H,), got none")
    return log_decay


def check_cu_seqlens(cu_seqlens, q: Tensor) -> Tensor:
    """``(N+1,)`` integer offsets on q's device: 0, strictly increasing, ending at total_T; q is ``(1, total_T, …)``.
    The shared check of every op (``hybrid.kernels.varlen``); returns the tensor (a ``PackedOffsets``, checked once
    where the batch entered the model, gives its own without a read back)."""
    return _check_cu_seqlens(cu_seqlens, q.shape[1], q.device, "cu_seqlens", batch=q.shape[0])


