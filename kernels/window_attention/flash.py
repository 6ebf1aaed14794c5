"""Sliding-window attention through flash-attn's `window_size` (CUDA, fp16/bf16, when flash-attn is
installed). flash-attn aligns a causal mask to the bottom right when S > T, which is this op's convention, and
broadcasts kv heads itself."""
from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

FLASH_AVAILABLE = importlib.util.find_spec("flash_attn") is not None


def flash_supports(q: Tensor) -> bool:
    return FLASH_AVAILABLE and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256


def window_attention_flash(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float) -> Tensor:
    """Same contract as `window_attention_reference` (window not None): key j is visible to query i iff
    S − T + i − (w − 1) ≤ j ≤ S − T + i, i.e. flash-attn's causal window `(w − 1, 0)`."""
    from flash_attn import flash_attn_func

    return flash_attn_func(q, k.to(q.dtype), v.to(q.dtype), softmax_scale=scale, causal=True,
                           window_size=(window - 1, 0))  # (B, T, H, D)
