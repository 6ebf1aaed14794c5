"""The causal depthwise conv through the `causal_conv1d` package (CUDA only, optional: `pip install
causal-conv1d>=1.4`, the `cuda` extra).

- `causal_conv1d_fn` on the `(B, C, T)` transpose of a contiguous `(B, T, C)` tensor, i.e. its channel-last
  layout, the only one in which it accepts `initial_states` and `seq_idx`. The final state is sliced from the
  inputs here (the package returns none with `seq_idx`).
- Packed sequences without initial states: `seq_idx` (`(1, total_T)` int32, the sequence of each token) keeps
  the taps inside each sequence. With initial states (the package refuses both together): the stream of
  `depthwise.packed_stream`, `[tail_0; x_0; tail_1; x_1; …]`, with no `seq_idx`, outputs read at the tokens' slots.
- `causal_conv1d_update` for one token: it mutates its state and has no autograd, so it runs on a fresh copy
  of the state and only when no gradient is needed.
The kernels take 2 ≤ W ≤ 4, C % 8 == 0 and float32 / float16 / bfloat16 (`shape_and_dtypes_fit`).
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..varlen import sequence_ids
from .depthwise import packed_stream

FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def causal_conv1d_module():
    """The `causal_conv1d` package if it imports with both entry points, else None (cached)."""
    try:
        import causal_conv1d as cc
    except Exception:  # ImportError, or a build without a matching CUDA runtime
        return None
    if not (hasattr(cc, "causal_conv1d_fn") and hasattr(cc, "causal_conv1d_update")):
        return None
    return cc


@torch.compiler.assume_constant_result
def causal_conv1d_importable() -> bool:
    """Whether ``causal_conv1d_module`` finds the package; a constant to torch.compile, which runs it once while
    tracing instead of tracing the import (an import that fails cannot be traced: on an H100 without the package,
    2026-11-28, every fullgraph compile of a model with a conv stopped there)."""
    return causal_conv1d_module() is not None


def shape_and_dtypes_fit(channels: int, width: int, *dtypes: torch.dtype) -> bool:
    return 2 <= width <= 4 and channels % 8 == 0 and all(dt in FUSED_DTYPES for dt in dtypes)


def _channel_last(x: Tensor) -> Tensor:
    """`(B, T, C)` → its `(B, C, T)` transpose with unit channel stride (size-1 dims may keep odd strides in
    `contiguous()`; the kernel checks them)."""
    B, T, C = x.shape
    xc = x.contiguous()
    if xc.stride() != (T * C, C, 1):
        xc = xc.clone(memory_format=torch.contiguous_format)
    return xc.transpose(1, 2)  # (B, C, T)


def _tail(x: Tensor, initial_state: Tensor | None, width: int) -> Tensor:
    """The last W−1 entries of `[tail; x]` along time: `(B, W−1, C)`."""
    B, T, C = x.shape
    if T >= width - 1:
        return x[:, T - (width - 1):]
    tail = x.new_zeros(B, width - 1, C) if initial_state is None else initial_state.to(x.dtype)
    return torch.cat([tail, x], dim=1)[:, T:]


def causal_conv1d_fused(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, initial_state: Tensor | None = None, *,
    output_final_state: bool = False, cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Same contract as `causal_conv1d_reference` (the kernel's shape, dtype and device limits apply)."""
    cc = causal_conv1d_module()
    W = weight.shape[1]
    if cu_seqlens is None:
        init = None if initial_state is None else initial_state.to(x.dtype).contiguous().transpose(1, 2)
        y = cc.causal_conv1d_fn(_channel_last(x), weight, bias, initial_states=init, activation=None)  # (B, C, T)
        return y.transpose(1, 2), (_tail(x, initial_state, W) if output_final_state else None)  # (B, T, C)
    if initial_state is None:
        seq_idx = sequence_ids(cu_seqlens, x.shape[1]).to(torch.int32)[None]  # (1, total_T)
        y = cc.causal_conv1d_fn(_channel_last(x), weight, bias, seq_idx=seq_idx, activation=None).transpose(1, 2)
        if not output_final_state:
            return y, None
    u, token_slot, final_slot = packed_stream(x, initial_state, cu_seqlens, W)  # (1, total_T + N·(W−1), C)
    if initial_state is not None:
        y_u = cc.causal_conv1d_fn(_channel_last(u), weight, bias, activation=None).transpose(1, 2)  # (1, L, C)
        y = y_u[:, token_slot]  # zero initial states: slot s's taps are the W−1 slots before it in the stream
    final = u[0, final_slot.flatten()].view(*final_slot.shape, x.shape[2]) if output_final_state else None
    return y, final


def causal_conv1d_update_fused(x: Tensor, weight: Tensor, bias: Tensor | None, state: Tensor):
    """One token through `causal_conv1d_update` on a fresh copy of the state (the caller's is not mutated):
    x `(B, C)`, state `(B, W−1, C)` → y `(B, C)`, new state `(B, W−1, C)`. No autograd."""
    B, C = x.shape
    fresh = torch.empty(B, C, weight.shape[1] - 1, device=x.device, dtype=x.dtype)  # updated in place
    fresh.copy_(state.transpose(1, 2))
    y = causal_conv1d_module().causal_conv1d_update(x, fresh, weight, bias, activation=None)
    return y, fresh.transpose(1, 2)  # (B, W−1, C)
