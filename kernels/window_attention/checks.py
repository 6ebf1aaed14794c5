"""The argument checks of window attention (each op folder's checks live in its ``checks.py``): shapes, the window,
and the offsets of packed queries and keys, in one-line errors naming the argument."""
from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_positive_int
from ..varlen import check_cu_seqlens, device_offsets, host_offsets

__all__ = ["check_attention", "check_packing"]


def check_attention(q: Tensor, k: Tensor, v: Tensor, window) -> None:
    """q `(B, T, H, D)`, k and v `(B, S ≥ T, G, D)` with G dividing H, a window of w ≥ 1 or None."""
    check_positive_int("window", window, allow_none=True)  # None: global
    if q.dim() != 4:
        raise ValueError(f"q: expected shape (B, T, H, D), got {tuple(q.shape)}")
    B, T, H, D = q.shape
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4 or t.shape[0] != B or t.shape[1] < T or t.shape[3] != D or H % max(t.shape[2], 1):
            raise ValueError(f"{name}: expected shape (B={B}, S ≥ T={T}, G dividing H={H}, D={D}), "
                             f"got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")


def check_packing(q: Tensor, k: Tensor, cu_seqlens, cu_seqlens_k) -> None:
    """Offsets of packed queries and keys (flash-attn's varlen convention); a `PackedOffsets` is taken as checked
    (its host copy answers the per-sequence check: no read back)."""
    if cu_seqlens is None:
        if cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_k: expected None when cu_seqlens is None (packed keys need packed "
                             "queries), got a tensor")
        return
    T, S = q.shape[1], k.shape[1]
    check_cu_seqlens(cu_seqlens, T, q.device, "cu_seqlens", batch=q.shape[0])
    if cu_seqlens_k is None:
        if S != T:
            raise ValueError(f"k: expected total_k = total_q = {T} tokens without cu_seqlens_k (no prefix), "
                             f"got shape {tuple(k.shape)}")
        return
    cu_k = check_cu_seqlens(cu_seqlens_k, S, q.device, "cu_seqlens_k")
    if cu_k.numel() != device_offsets(cu_seqlens).numel():
        raise ValueError(f"cu_seqlens_k: expected {device_offsets(cu_seqlens).numel()} entries (N + 1, as "
                         f"cu_seqlens), got {cu_k.numel()}")
    if torch.compiler.is_compiling():
        return
    offsets_q, offsets_k = host_offsets(cu_seqlens), host_offsets(cu_seqlens_k)
    for n in range(len(offsets_q) - 1):
        lq, lk = offsets_q[n + 1] - offsets_q[n], offsets_k[n + 1] - offsets_k[n]
        if lk < lq:
            raise ValueError(f"cu_seqlens_k: expected each sequence to have at least as many keys as queries, "
                             f"got sequence {n} with {lk} keys for {lq} queries")
