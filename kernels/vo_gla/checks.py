"""Argument checks shared by the ways of computing vo_gla: one line each, ``name: expected …, got …``.

The static checks (types, shapes, dtypes, devices) always run: they cost nothing and trace cleanly. The value
checks (``check_values``: decays ≤ 0 and finite, angles finite; the offsets of ``cu_seqlens``) read tensors back
(one host sync) and are skipped while torch.compile traces.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..matrix_state import (FLOAT_DTYPES, bad_decay_error, check_state, check_tile_size,  # noqa: F401
                            decay_out_of_range, state_dtype)
from ..varlen import check_cu_seqlens as _check_cu_seqlens




def _tensor(name: str, x, like: Tensor | None, layout: str) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor of shape {layout}, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected a floating dtype (float32, bfloat16, float16, float64), got {x.dtype}")
    if like is not None and x.device != like.device:
        raise ValueError(f"{name}: expected a tensor on {like.device} (the device of q), got {x.device}")


def _broadcasts(name: str, t: Tensor, target: tuple[int, ...], layout: str) -> None:
    shape = tuple(t.shape)
    if len(shape) > len(target) or not all(s in (1, g) for s, g in zip(reversed(shape), reversed(target))):
        raise ValueError(f"{name}: expected a shape that broadcasts to {layout} = {target}, got {shape}")


def check_inputs(q, k, v, log_decay, theta, *, step: bool = False) -> None:
    """q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)`` with Dv even (rotary pairs), log_decay broadcastable to
    ``(B, T, H)`` (``(H,)``: static per head), theta to ``(B, T, H, Dv/2)`` (``(H, Dv/2)``: static per pair); with
    ``step`` the same without the time axis."""
    lay = ("(B, H, Dk)", "(B, H, Dv)") if step else ("(B, T, H, Dk)", "(B, T, H, Dv)")
    _tensor("q", q, None, lay[0])
    for name, x, layout in (("k", k, lay[0]), ("v", v, lay[1])):
        _tensor(name, x, q, layout)
    ndim = 3 if step else 4
    if q.dim() != ndim:
        raise ValueError(f"q: expected shape {lay[0]}, got {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k: expected shape {tuple(q.shape)} (the shape of q), got {tuple(k.shape)}")
    if v.dim() != ndim or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v: expected shape {tuple(q.shape[:-1])} + (Dv,), got {tuple(v.shape)}")
    if v.shape[-1] % 2:
        raise ValueError(f"v: expected an even value head size Dv (rotary pairs), got Dv={v.shape[-1]}")
    lead = tuple(q.shape[:-1])  # (B, T, H) or (B, H)
    pairs = lead + (v.shape[-1] // 2,)
    for name, t, target, layout in (
            ("log_decay", log_decay, lead, "(B, H)" if step else "(B, T, H)"),
            ("theta", theta, pairs, "(B, H, Dv/2)" if step else "(B, T, H, Dv/2)")):
        _tensor(name, t, q, layout)
        _broadcasts(name, t, target, layout)


def check_values(log_decay: Tensor, theta: Tensor, names: tuple[str, str] = ("log_decay", "theta")) -> None:
    """``log_decay`` finite and ≤ 0, ``theta`` finite (NaN fails both): one host sync, none while compiling."""
    if torch.compiler.is_compiling():
        return
    bad_decay, bad_theta = torch.stack([decay_out_of_range(log_decay), (~torch.isfinite(theta)).any()]).tolist()
    if bad_decay:
        raise bad_decay_error(log_decay, names[0])
    if bad_theta:
        n_nan, n_inf = int(torch.isnan(theta).sum()), int(torch.isinf(theta).sum())
        raise ValueError(f"{names[1]}: expected finite angles, got {n_nan} NaN and {n_inf} inf")


def check_cu_seqlens(cu_seqlens, q: Tensor) -> int:
    """``(N+1,)`` integer offsets on q's device into ``q`` of shape ``(1, total_T, …)`` (the shared check of every
    op, ``hybrid.kernels.varlen``; a ``PackedOffsets``, checked where the batch entered the model, passes without
    a read back). Returns N."""
    return _check_cu_seqlens(cu_seqlens, q.shape[1], q.device, "cu_seqlens", batch=q.shape[0]).numel() - 1


