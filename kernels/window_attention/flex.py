"""Causal (sliding-window) attention through FlexAttention (torch ≥ 2.5): a block-sparse kernel that skips the
tiles outside the mask, with GQA broadcast by the kernel.

Packed sequences take a document mask: `mask_mod` reads per-token sequence ids and positions (`varlen.py`),
so no query sees another sequence's keys and the window counts positions within the sequence. Its BlockMask
is cached by the offsets' host values; under torch.compile, which hands over the offset tensor alone, it is built
on the device with no value read back, once for the layers of a step.

On CUDA the compiled kernel runs (compiled once per process, then per new shape); elsewhere the eager
FlexAttention runs, which computes the dense scores and (torch 2.13) has no backward on CPU: it exists there
only so that tests can check this path's mask against the reference.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect

import torch
from torch import Tensor

from ..dynamo_limits import recompile_room
from ..varlen import PackedOffsets, device_offsets, on_device
from .varlen import query_key_positions

FLEX_AVAILABLE = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


# Graphs Dynamo may build for the compiled FlexAttention (and the compiled create_block_mask) before it gives up
# and runs them eager. Its default, 8, was reached on an H100 by one benchmark run (2026-11-28): training (bf16
# autocast, grad) then measuring at 1-8x the length (float32, no grad) recompiled for every grad mode, autocast
# state, dtype and length, and the eager FlexAttention that followed materialised the whole score matrix (64 GiB
# at 16K tokens: out of memory).
RECOMPILE_ROOM = 64


def _room_to_recompile():
    """Outside a compiled region, Dynamo's recompile limit raised to ``RECOMPILE_ROOM`` (inside one, the
    enclosing compile decides)."""
    return contextlib.nullcontext() if torch.compiler.is_compiling() else recompile_room(RECOMPILE_ROOM)


def _create_block_mask(mask_mod, n_queries: int, n_keys: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    # compiled on CUDA: eager create_block_mask evaluates the mask over the whole (T, S) grid
    compile_it = device.startswith("cuda") and "_compile" in inspect.signature(create_block_mask).parameters
    extra = {"_compile": True} if compile_it else {}
    with _room_to_recompile():
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


def _document_mask(cu_q: Tensor, cu_k: Tensor, n_queries: int, n_keys: int, window: int | None, device: str):
    """The mask of packed sequences, from offsets on the device, as a BlockMask (no value read back)."""
    seq_q, pos_q, seq_k, pos_k = query_key_positions(cu_q, cu_k, n_queries, n_keys)  # (Tq,), (Tk,)

    def document_causal(b, h, q_idx, kv_idx):
        return (seq_q[q_idx] == seq_k[kv_idx]) & (pos_k[kv_idx] <= pos_q[q_idx])

    def document_window(b, h, q_idx, kv_idx):
        return document_causal(b, h, q_idx, kv_idx) & (pos_k[kv_idx] > pos_q[q_idx] - window)

    return _create_block_mask(document_causal if window is None else document_window, n_queries, n_keys, device)


@functools.lru_cache(maxsize=8)
def _document_block_mask(offsets_q: tuple[int, ...], offsets_k: tuple[int, ...], window: int | None, device: str):
    """The mask of packed sequences whose offsets are known on the host (the cache key)."""
    cu_q = on_device(offsets_q, device)
    cu_k = on_device(offsets_k, device)
    return _document_mask(cu_q, cu_k, offsets_q[-1], offsets_k[-1], window, device)


# The last mask built from offsets known only on the device, with the offset tensors it was built from (held, so
# that their identity stays theirs) and its key: the attention layers of one step share it.
_LAST_DEVICE_MASK: list = []


@torch.compiler.disable
def _packed_block_mask(cu_seqlens, cu_seqlens_k, window: int | None, n_queries: int, n_keys: int, device: str):
    """The document mask of packed offsets (tensors or `PackedOffsets`), outside any compiled graph (one graph
    break), so that no compiled frame guards on the offsets' count or values (a recompile for every packing).
    Offsets with host values (a `PackedOffsets` the model checked) are cached by those values. Under torch.compile
    the model hands over the tensor alone: the mask is then built on the device, with no read back (a host sync
    per layer), and reused while the same offset tensors come back unchanged (the next layers of the step)."""
    bounds_q = cu_seqlens.bounds if isinstance(cu_seqlens, PackedOffsets) else None
    bounds_k = bounds_q if cu_seqlens_k is None else (
        cu_seqlens_k.bounds if isinstance(cu_seqlens_k, PackedOffsets) else None)
    if bounds_q is not None and bounds_k is not None:
        return _document_block_mask(tuple(bounds_q), tuple(bounds_k), window, device)
    cu_q = device_offsets(cu_seqlens)
    cu_k = cu_q if cu_seqlens_k is None else device_offsets(cu_seqlens_k)
    key = (window, n_queries, n_keys, device, cu_q._version, cu_k._version)
    if _LAST_DEVICE_MASK and _LAST_DEVICE_MASK[0] is cu_q and _LAST_DEVICE_MASK[1] is cu_k \
            and _LAST_DEVICE_MASK[2] == key:
        return _LAST_DEVICE_MASK[3]
    mask = _document_mask(cu_q, cu_k, n_queries, n_keys, window, device)
    _LAST_DEVICE_MASK[:] = [cu_q, cu_k, key, mask]
    return mask


def window_attention_flex(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float,
                          cu_seqlens: Tensor | None = None, cu_seqlens_k: Tensor | None = None) -> Tensor:
    """Same contract as `window_attention_reference`."""
    from torch.nn.attention.flex_attention import flex_attention

    T, H, S, G = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    if cu_seqlens is not None:
        block_mask = _packed_block_mask(cu_seqlens, cu_seqlens_k, window, T, S, str(q.device))
    else:
        start = 0 if window is None else max(0, S - T - (window - 1))  # earlier keys: outside every window
        k, v = k[:, start:], v[:, start:]  # (B, S', G, D)
        block_mask = _block_mask(T, S - start, window, str(q.device))
    attend = _compiled_flex() if q.is_cuda else flex_attention
    with _room_to_recompile():
        o = attend(q.transpose(1, 2), k.to(q.dtype).transpose(1, 2), v.to(q.dtype).transpose(1, 2),
                   block_mask=block_mask, scale=scale, enable_gqa=H != G)  # (B, H, T, D)
    return o.transpose(1, 2)  # (B, T, H, D)
