"""Causal (sliding-window) attention through flash-attn (CUDA, fp16/bf16, when flash-attn is installed).

flash-attn aligns a causal mask to the bottom right when S > T (per sequence in its varlen form), which is
this op's convention, and broadcasts kv heads itself. Packed sequences go to `flash_attn_varlen_func` with
int32 offsets and the longest lengths (one host read of the offsets).
"""
from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from ..varlen import PackedOffsets, device_offsets

FLASH_AVAILABLE = importlib.util.find_spec("flash_attn") is not None


def flash_supports(q: Tensor) -> bool:
    return FLASH_AVAILABLE and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256


def window_attention_flash(
    q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float,
    cu_seqlens: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
) -> Tensor:
    """Same contract as `window_attention_reference`: key j is visible to query i iff
    S − T + i − (w − 1) ≤ j ≤ S − T + i, i.e. flash-attn's causal window `(w − 1, 0)`; `(−1, 0)` without a
    window."""
    window_size = (-1, 0) if window is None else (window - 1, 0)
    k, v = k.to(q.dtype), v.to(q.dtype)
    if cu_seqlens is None:
        from flash_attn import flash_attn_func

        return flash_attn_func(q, k, v, softmax_scale=scale, causal=True,
                               window_size=window_size)  # (B, T, H, D)

    from flash_attn import flash_attn_varlen_func

    cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
    max_q, max_k = _longest(cu_seqlens), _longest(cu_k)
    cu_q, cu_k = device_offsets(cu_seqlens).to(torch.int32), device_offsets(cu_k).to(torch.int32)
    o = flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=True,
                               window_size=window_size)  # (total_q, H, D)
    return o.unsqueeze(0)  # (1, total_q, H, D)


def _longest(cu_seqlens) -> int:
    """The longest sequence: known on the host for offsets checked once (``PackedOffsets``), else read back."""
    if isinstance(cu_seqlens, PackedOffsets) and cu_seqlens.max_len is not None:
        return cu_seqlens.max_len
    return int(device_offsets(cu_seqlens).diff().max())
