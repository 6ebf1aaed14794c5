"""Sliding-window attention through FlexAttention (torch ≥ 2.5): a block-sparse kernel that skips the tiles
outside the band, with GQA broadcast by the kernel.

On CUDA the compiled kernel runs (compiled once per process, then per new shape); elsewhere the eager
FlexAttention runs, which computes the dense scores and (torch 2.13) has no backward on CPU: it exists there
only so that tests can check this path's mask against the reference.
"""
from __future__ import annotations

import functools
import importlib.util

import torch
from torch import Tensor

FLEX_AVAILABLE = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=32)
def _block_mask(n_queries: int, n_keys: int, window: int, device: str):
    """The band of `window_attention_reference` as a FlexAttention BlockMask (cached: a training loop asks
    for the same few shapes every step)."""
    import inspect

    from torch.nn.attention.flex_attention import create_block_mask

    prefix = n_keys - n_queries
    # compiled on CUDA: eager create_block_mask evaluates the mask over the whole (T, S) grid
    compile_it = device.startswith("cuda") and "_compile" in inspect.signature(create_block_mask).parameters

    def in_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + prefix) & (kv_idx > q_idx + prefix - window)

    extra = {"_compile": True} if compile_it else {}
    return create_block_mask(in_window, None, None, n_queries, n_keys, device=device, **extra)


def window_attention_flex(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float) -> Tensor:
    """Same contract as `window_attention_reference` (window not None)."""
    from torch.nn.attention.flex_attention import flex_attention

    T, H, S, G = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    start = max(0, S - T - (window - 1))  # earlier keys are outside every query's window
    k, v = k[:, start:].to(q.dtype), v[:, start:].to(q.dtype)  # (B, S', G, D)
    block_mask = _block_mask(T, S - start, window, str(q.device))
    attend = _compiled_flex() if q.is_cuda else flex_attention
    o = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask, scale=scale,
               enable_gqa=H != G)  # (B, H, T, D)
    return o.transpose(1, 2)  # (B, T, H, D)
