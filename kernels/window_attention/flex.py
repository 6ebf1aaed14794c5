"""Causal (sliding-window) attention through FlexAttention (torch ≥ 2.5): a block-sparse kernel that skips the
tiles outside the mask, with GQA broadcast by the kernel.

Packed sequences take a document mask: `mask_mod` reads per-token sequence ids and positions (`varlen.py`),
so no query sees another sequence's keys and the window counts positions within the sequence. Its BlockMask
is cached by the offsets (the layers of one step share it).

On CUDA the compiled kernel runs (compiled once per process, then per new shape); elsewhere the eager
FlexAttention runs, which computes the dense scores and (torch 2.13) has no backward on CPU: it exists there
only so that tests can check this path's mask against the reference.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect

import torch
from torch import Tensor

from ..varlen import host_offsets
from .varlen import query_key_positions

FLEX_AVAILABLE = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _create_block_mask(mask_mod, n_queries: int, n_keys: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    # compiled on CUDA: eager create_block_mask evaluates the mask over the whole (T, S) grid
    compile_it = device.startswith("cuda") and "_compile" in inspect.signature(create_block_mask).parameters
    extra = {"_compile": True} if compile_it else {}
    return create_block_mask(mask_mod, None, None, n_queries, n_keys, device=device, **extra)


@functools.lru_cache(maxsize=32)
def _block_mask(n_queries: int, n_keys: int, window: int | None, device: str):
    """The mask of `window_attention_reference` for one sequence per batch row as a FlexAttention BlockMask
    (cached: a training loop asks for the same few shapes every step)."""
    prefix = n_keys - n_queries

    def in_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + prefix) & (kv_idx > q_idx + prefix - window)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + prefix

    return _create_block_mask(causal if window is None else in_window, n_queries, n_keys, device)


@functools.lru_cache(maxsize=8)
def _document_block_mask(offsets_q: tuple[int, ...], offsets_k: tuple[int, ...], window: int | None, device: str):
    """The mask of packed sequences (offsets as host tuples: the cache key) as a BlockMask."""
    cu_q = torch.tensor(offsets_q, device=device)
    cu_k = torch.tensor(offsets_k, device=device)
    seq_q, pos_q, seq_k, pos_k = query_key_positions(cu_q, cu_k, offsets_q[-1], offsets_k[-1])  # (Tq,), (Tk,)

    def document_causal(b, h, q_idx, kv_idx):
        return (seq_q[q_idx] == seq_k[kv_idx]) & (pos_k[kv_idx] <= pos_q[q_idx])

    def document_window(b, h, q_idx, kv_idx):
        return document_causal(b, h, q_idx, kv_idx) & (pos_k[kv_idx] > pos_q[q_idx] - window)

    mask_mod = document_causal if window is None else document_window
    return _create_block_mask(mask_mod, offsets_q[-1], offsets_k[-1], device)


@torch.compiler.disable
def _packed_block_mask(cu_seqlens, cu_seqlens_k, window: int | None, device: str):
    """`_document_block_mask` of packed offsets (tensors or `PackedOffsets`). Never traced: under torch.compile the
    offsets are read back here, outside the graph (one graph break), so that no compiled frame guards on their
    count or values (traced, the host tuples would be a recompile for every new packing)."""
    offsets_q = tuple(host_offsets(cu_seqlens))
    offsets_k = offsets_q if cu_seqlens_k is None else tuple(host_offsets(cu_seqlens_k))
    return _document_block_mask(offsets_q, offsets_k, window, device)


def window_attention_flex(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float,
                          cu_seqlens: Tensor | None = None, cu_seqlens_k: Tensor | None = None) -> Tensor:
    """Same contract as `window_attention_reference`."""
    from torch.nn.attention.flex_attention import flex_attention

    T, H, S, G = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    if cu_seqlens is not None:
        block_mask = _packed_block_mask(cu_seqlens, cu_seqlens_k, window, str(q.device))
    else:
        start = 0 if window is None else max(0, S - T - (window - 1))  # earlier keys: outside every window
        k, v = k[:, start:], v[:, start:]  # (B, S', G, D)
        block_mask = _block_mask(T, S - start, window, str(q.device))
    attend = _compiled_flex() if q.is_cuda else flex_attention
    o = attend(q.transpose(1, 2), k.to(q.dtype).transpose(1, 2), v.to(q.dtype).transpose(1, 2),
               block_mask=block_mask, scale=scale, enable_gqa=H != G)  # (B, H, T, D)
    return o.transpose(1, 2)  # (B, T, H, D)
