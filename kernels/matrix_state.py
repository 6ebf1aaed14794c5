"""What the two ops with a matrix state per head share, retention (``hybrid.kernels.retention``) and VO-RoPE gated
linear attention (``hybrid.kernels.vo_gla``): the state's dtype, its check, the check of the decay's values, and
the result of an empty input."""
from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_positive_int

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Recurrent states, decays and angles are float32, or float64 when the activations are float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_state(state, name: str, shape: tuple[int, ...], q: Tensor, layout: str = "(B, H, Dk, Dv)") -> None:
    """None, or a floating tensor of ``shape`` on q's device."""
    if state is None:
        return
    if not isinstance(state, Tensor):
        raise ValueError(f"{name}: expected None or a torch.Tensor of shape {layout} = {shape}, got "
                         f"{type(state).__name__}")
    if tuple(state.shape) != shape:
        raise ValueError(f"{name}: expected shape {layout} = {shape}, got {tuple(state.shape)}")
    if state.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected a floating dtype, got {state.dtype}")
    if state.device != q.device:
        raise ValueError(f"{name}: expected a tensor on {q.device} (the device of q), got {state.device}")


def decay_out_of_range(log_decay: Tensor) -> Tensor:
    """0-dim bool tensor: some value of ``log_decay`` is not finite and ≤ 0 (NaN included); no read back here."""
    return (~(torch.isfinite(log_decay) & (log_decay <= 0))).any()


def bad_decay_error(log_decay: Tensor, name: str = "log_decay") -> ValueError:
    """The one-line error for a log decay that is not finite and ≤ 0 (called once a check found one)."""
    if torch.isnan(log_decay).any():
        got = "NaN"
    elif torch.isinf(log_decay).any():
        got = "inf" if (log_decay == float("inf")).any() else "-inf (a decay of 0)"
    else:
        got = f"a maximum of {log_decay.max().item():.4g}"
    return ValueError(f"{name}: expected finite values <= 0 (the log of a decay in (0, 1]), got {got}")


def check_tile_size(tile_size) -> None:
    check_positive_int("tile_size", tile_size)


def empty_input_result(q: Tensor, v: Tensor, initial_state: Tensor | None, cu_seqlens: Tensor | None,
                       output_final_state: bool) -> tuple[Tensor, Tensor | None]:
    """The op on T = 0 tokens, q ``(B, 0, H, Dk)``: no output, and the state passes through (a copy: outputs never
    alias inputs); the final state is ``(N, H, Dk, Dv)`` with cu_seqlens, ``(B, H, Dk, Dv)`` without."""
    B, _, H, Dk = q.shape
    Dv = v.shape[-1]
    o = q.new_zeros(B, 0, H, Dv)
    if not output_final_state:
        return o, None
    n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
    if initial_state is None:
        return o, q.new_zeros(n, H, Dk, Dv, dtype=state_dtype(q.dtype))
    return o, initial_state.to(state_dtype(q.dtype), copy=True)
