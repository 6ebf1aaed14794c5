"""Packed sequences (flash-attn's `cu_seqlens` convention), shared by every op and by the model.

N sequences of lengths ``L_0 … L_{N−1}`` are packed into one ``(1, total_T, …)`` batch; ``cu_seqlens`` is the
LongTensor ``(N+1,)`` of their offsets ``[0, L_0, L_0 + L_1, …, total_T]``. Sequence n holds the tokens
``cu_seqlens[n] ≤ t < cu_seqlens[n+1]``; its position ``p_t = offset_n + t − cu_seqlens[n]`` restarts at its
own offset (0 unless it continues an earlier call).
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_cu_seqlens", "sequence_ids", "positions_in_sequence", "lengths"]


def check_cu_seqlens(cu_seqlens, total: int, device, name: str = "cu_seqlens", batch: int | None = None) -> Tensor:
    """Validate offsets for a packed batch of ``total`` tokens on ``device`` and return them.

    One-line ``ValueError`` naming ``name`` when: not a 1-D integer tensor with ≥ 2 entries, on another device,
    not starting at 0, not strictly increasing, not ending at ``total``, or the packed batch has ``batch != 1``.
    The value checks read the (small) tensor on the host; under ``torch.compile`` they are skipped.
    """
    if not isinstance(cu_seqlens, Tensor):
        raise ValueError(f"{name}: expected a LongTensor (N+1,) of sequence offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D tensor (N+1,) with N ≥ 1, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in (torch.int64, torch.int32) or cu_seqlens.is_floating_point():
        raise ValueError(f"{name}: expected an int64 (or int32) tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.device != torch.device(device):
        raise ValueError(f"{name}: expected a tensor on {device} (the inputs' device), got one on {cu_seqlens.device}")
    if batch is not None and batch != 1:
        raise ValueError(f"{name}: expected a packed batch of shape (1, total_T, …), got batch size {batch}")
    if torch.compiler.is_compiling():
        return cu_seqlens
    values = cu_seqlens.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}: expected offsets starting at 0, got {values[0]}")
    if any(b <= a for a, b in zip(values, values[1:])):
        bad = next(i for i, (a, b) in enumerate(zip(values, values[1:])) if b <= a)
        raise ValueError(f"{name}: expected strictly increasing offsets, got {values[bad]} then {values[bad + 1]} "
                         f"at index {bad}")
    if values[-1] != total:
        raise ValueError(f"{name}: expected offsets ending at total_T={total}, got {values[-1]}")
    return cu_seqlens


def lengths(cu_seqlens: Tensor) -> Tensor:
    """``(N,)`` sequence lengths."""
    return cu_seqlens[1:] - cu_seqlens[:-1]


def sequence_ids(cu_seqlens: Tensor, total: int) -> Tensor:
    """``(total,)`` int64: the sequence each token belongs to."""
    n = torch.arange(cu_seqlens.numel() - 1, device=cu_seqlens.device)
    return torch.repeat_interleave(n, lengths(cu_seqlens).long(), output_size=total)


def positions_in_sequence(cu_seqlens: Tensor, total: int, offsets: Tensor | None = None) -> Tensor:
    """``(total,)`` int64: ``offset_n + t − cu_seqlens[n]`` for token t of sequence n (``offsets`` ``(N,)``, default
    zeros)."""
    ids = sequence_ids(cu_seqlens, total)
    pos = torch.arange(total, device=cu_seqlens.device) - cu_seqlens.long()[ids]
    return pos if offsets is None else pos + offsets.to(pos.device).long()[ids]
