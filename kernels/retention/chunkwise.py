"""The chunkwise form of retention (RetNet, section 2.2): the fast form for whole sequences.

Time is cut into N tiles of C = ``retention_chunk`` tokens (plus one shorter tile for the remainder).
Position c of tile n, with S_n the state entering the tile:

    o_{n,c} = Σ_{m≤c} γ^{c−m} (q_{n,c} · k_{n,m}) v_{n,m}   +   γ^{c+1} q_{n,c} S_n        (intra + inter)
    S_{n+1} = γ^C S_n + Σ_m γ^{C−1−m} k_{n,m}ᵀ v_{n,m}                                  (the carried state)

All tiles' intra parts and their own key-value sums are batched in one einsum each; only the carry runs
over the N tiles, on ``(B, H, Dk, Dv)`` states. Every decay is γ to a power in [0, C], so nothing
overflows. The largest tensors are the tile scores ``(B, N, H, C, C)`` and the per-tile states
``(B, N, H, Dk, Dv)``: O(T·C) and O(T·Dk·Dv/C), no ``(T, T)`` tensor when C < T.
"""
from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_RETENTION_CHUNK = 64


def _tile_decays(C: int, log_gamma: Tensor):
    """For tiles of C tokens: the intra decay ``(H, C, C)`` (γ^{c−m}, m ≤ c), γ^{c+1} and γ^{C−1−m} ``(C, H)``,
    and γ^C ``(H,)``."""
    n = torch.arange(C, device=log_gamma.device, dtype=log_gamma.dtype)
    diff = n[:, None] - n[None, :]  # (C, C): c − m
    intra = torch.exp(diff.clamp(min=0)[None] * log_gamma[:, None, None]).masked_fill(diff[None] < 0, 0.0)
    q_decay = torch.exp((n + 1)[:, None] * log_gamma)  # (C, H)
    k_decay = torch.exp((C - 1 - n)[:, None] * log_gamma)  # (C, H)
    return intra, q_decay, k_decay, torch.exp(C * log_gamma)


def _tiles(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, S: Tensor | None, C: int):
    """Retention over T = N·C tokens as N tiles of C, continuing S (None: zeros). Returns o, S'."""
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    N = T // C
    qt = q.reshape(B, N, C, H, Dk)  # split time into (tile, position)
    kt = k.reshape(B, N, C, H, Dk)
    vt = v.reshape(B, N, C, H, Dv)
    intra, q_decay, k_decay, tile_decay = _tile_decays(C, log_gamma)
    scores = torch.einsum("bnchd,bnmhd->bnhcm", qt, kt) * intra  # (B, N, H, C, C)
    o = torch.einsum("bnhcm,bnmhe->bnche", scores, vt)  # (B, N, C, H, Dv)
    kv = torch.einsum("bnmhd,bnmhe->bnhde", kt * k_decay[:, :, None], vt)  # (B, N, H, Dk, Dv): each tile's own
    # carry across tiles: entering[n] = S_n, S_{n+1} = γ^C S_n + kv_n
    g = tile_decay[None, :, None, None]  # (1, H, 1, 1)
    S = torch.zeros_like(kv[:, 0]) if S is None else S
    entering = []
    # unbind, not kv[:, n]: the backward of N selects would zero-fill N full-size gradients (O(N²) memory
    # traffic: at T = 16K it took more time than the rest of the layer); unbind's backward is one stack
    for kv_n in kv.unbind(1):
        entering.append(S)
        S = g * S + kv_n
    entering = torch.stack(entering, dim=1)  # (B, N, H, Dk, Dv)
    o = o + torch.einsum("bnchd,bnhde->bnche", qt * q_decay[:, :, None], entering)
    return o.reshape(B, T, H, Dv), S  # (B, N, C, H, Dv) -> (B, T, H, Dv)


def retention_chunkwise(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, S: Tensor | None = None,
                        retention_chunk: int = DEFAULT_RETENTION_CHUNK):
    """q, k: ``(B, T, H, Dk)``; v: ``(B, T, H, Dv)``; log_gamma: ``(H,)``; S: ``(B, H, Dk, Dv)`` or None (zeros);
    retention_chunk: the tile length C (any positive int; ≥ T computes the parallel form in one tile).

    Returns ``o`` ``(B, T, H, Dv)`` and ``S'`` ``(B, H, Dk, Dv)``, the same numbers as ``retention_reference``.
    """
    if isinstance(retention_chunk, bool) or not isinstance(retention_chunk, int) or retention_chunk < 1:
        raise ValueError(f"retention_chunk: expected a positive int, got {retention_chunk!r}")
    B, T, H, Dk = q.shape
    if T == 0:  # nothing to mix: the state passes through
        return v.new_zeros(v.shape), (S if S is not None else v.new_zeros(B, H, Dk, v.shape[-1]))
    C = min(retention_chunk, T)
    full = T - T % C
    if full == T:
        return _tiles(q, k, v, log_gamma, S, C)
    o_full, S = _tiles(q[:, :full], k[:, :full], v[:, :full], log_gamma, S, C)
    o_tail, S = _tiles(q[:, full:], k[:, full:], v[:, full:], log_gamma, S, T - full)  # one shorter tile
    return torch.cat([o_full, o_tail], dim=1), S
