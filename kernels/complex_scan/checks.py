"""Input checks and normalisation shared by every complex_scan backend.

Backends receive:
- ``x``: contiguous ``(B, T, H, D)``, a real float dtype, ``D`` even;
- ``log_decay``, ``theta``: contiguous, in the state dtype (float32, or float64 for float64 ``x``), each of
  shape ``(Bd, Td, H, P)`` with ``Bd ∈ {1, B}`` and ``Td ∈ {1, T}`` (1 = broadcast, never materialised);
- ``initial_state``: ``None`` or contiguous ``(B, H, D)`` in the state dtype.

Packed sequences (``cu_seqlens``, ``(N+1,)`` offsets into one ``(1, total_T, H, D)`` row; or a ``PackedOffsets``,
checked once already) never reach a backend: ``interface.py`` turns them into one row whose decay restarts at each
offset.

Checks that read values back from the tensors (one host sync) are skipped while ``torch.compile`` traces.
"""
from __future__ import annotations

import torch

from ..checks import check_positive_int
from ..varlen import check_cu_seqlens as shared_check_cu_seqlens

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Recurrent states and angles are float32, or float64 when the activations are float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_x(x: torch.Tensor, name: str = "x", ndim: int = 4, layout: str = "(B, T, H, D)") -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor of shape {layout}, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{name}: expected a real floating dtype (float32, bfloat16, float16 or float64), got {x.dtype}"
        )
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected shape {layout}, got {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(
            f"{name}: expected an even last dimension D (rotary pairs), got D={x.shape[-1]}"
        )


def check_decay_like(t, name: str, target: tuple[int, ...], layout: str, like: torch.Tensor) -> torch.Tensor:
    """Check that ``t`` broadcasts to ``target``; return it as a tensor in the state dtype."""
    if not isinstance(t, torch.Tensor):
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            t = torch.full((), float(t), device=like.device)  # a fill: no copy from the host
        else:
            raise ValueError(f"{name}: expected a tensor broadcastable to {layout}, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
    if t.device != like.device:
        raise ValueError(f"{name}: expected a tensor on {like.device} (the device of x), got {t.device}")
    shape = tuple(t.shape)
    ok = len(shape) <= len(target) and all(
        s == 1 or s == g for s, g in zip(reversed(shape), reversed(target))
    )
    if not ok:
        raise ValueError(f"{name}: shape {shape} does not broadcast to {layout} = {target}")
    return t.to(state_dtype(like.dtype))


def check_scan_values(log_decay: torch.Tensor, theta: torch.Tensor, names: tuple[str, str]) -> None:
    """``log_decay ≤ 0`` (−inf allowed: γ = 0) and ``theta`` finite; NaN fails both. Both flags are read
    back together: one device sync (skipped while torch.compile traces)."""
    if torch.compiler.is_compiling():
        return
    bad = torch.stack([(~(log_decay <= 0)).any(), (~torch.isfinite(theta)).any()]).tolist()
    if bad[0]:
        n_nan = int(torch.isnan(log_decay).sum())
        got = f"{n_nan} NaN" if n_nan else f"a maximum of {log_decay.max().item():.4g}"
        raise ValueError(f"{names[0]}: expected values <= 0 (the log of a decay in [0, 1]), got {got}")
    if bad[1]:
        n_nan, n_inf = int(torch.isnan(theta).sum()), int(torch.isinf(theta).sum())
        raise ValueError(f"{names[1]}: expected finite angles, got {n_nan} NaN and {n_inf} inf")


def normalise_decay_like(t: torch.Tensor, B: int, T: int, H: int, P: int) -> torch.Tensor:
    """Reshape to ``(Bd, Td, H, P)``: batch and time axes keep size 1 when broadcast, H and P are full.

    Differentiable (reshape / expand), so autograd sums gradients back to the caller's shape.
    """
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))  # (b, t, h, p) with 1s prepended
    Bd, Td = t.shape[0], t.shape[1]
    return t.expand(Bd, Td, H, P).contiguous()


def check_state(state, name: str, shape: tuple[int, ...], like: torch.Tensor,
                layout: str = "(B, H, D)") -> torch.Tensor | None:
    if state is None:
        return None
    if not isinstance(state, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor of shape {layout} = {shape} or None, got {type(state).__name__}")
    if state.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected a float32 tensor, got {state.dtype}")
    if tuple(state.shape) != shape:
        raise ValueError(f"{name}: expected shape {layout} = {shape}, got {tuple(state.shape)}")
    if state.device != like.device:
        raise ValueError(f"{name}: expected a tensor on {like.device} (the device of x), got {state.device}")
    return state.to(state_dtype(like.dtype)).contiguous()


def check_block_size(block_size) -> None:
    check_positive_int("block_size", block_size, allow_none=True)


def check_cu_seqlens(cu_seqlens, x: torch.Tensor) -> torch.Tensor:
    """``cu_seqlens``: ``(N+1,)`` int64 (or int32) offsets on x's device into ``x`` of shape ``(1, total_T, H, D)``:
    0 first, strictly increasing (no empty sequence), ``total_T`` last; returned as the tensor. The shared check of
    every op (``hybrid.kernels.varlen``): its value checks read the small tensor back (one host sync), except while
    torch.compile traces, or for a ``PackedOffsets`` (checked once where the batch entered the model)."""
    return shared_check_cu_seqlens(cu_seqlens, x.shape[1], x.device, "cu_seqlens", batch=x.shape[0])
