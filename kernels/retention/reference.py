"""The parallel form of retention, written as the formula reads: the ground truth for the other forms.

    o_n = Σ_{m≤n} γ^{n−m} (q_n · k_m) v_m + γ^{n+1} q_n S,      S' = γ^T S + Σ_m γ^{T−1−m} k_mᵀ v_m

It builds the ``(H, T, T)`` decay matrix ``Dec[n, m] = exp((n − m)·log γ)`` (m ≤ n, else 0; no division,
nothing overflows, far entries underflow to 0) and the ``(B, H, T, T)`` scores: O(T²) time and memory.
Tests run it in float64; models use ``retention_chunkwise``.
"""
from __future__ import annotations

import torch
from torch import Tensor


def retention_reference(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, S: Tensor | None = None):
    """q, k: ``(B, T, H, Dk)``; v: ``(B, T, H, Dv)``; log_gamma: ``(H,)``; S: ``(B, H, Dk, Dv)`` or None (zeros).

    Returns ``o`` ``(B, T, H, Dv)`` and the state after the T tokens ``S'`` ``(B, H, Dk, Dv)``.
    """
    T = q.shape[1]
    n = torch.arange(T, device=q.device, dtype=log_gamma.dtype)
    diff = n[:, None] - n[None, :]  # (T, T): n − m
    decay = torch.exp(diff.clamp(min=0)[None] * log_gamma[:, None, None])  # (H, T, T)
    decay = decay.masked_fill(diff[None] < 0, 0.0)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * decay  # (B, H, T, T)
    o = torch.einsum("bhnm,bmhe->bnhe", scores, v)  # (B, T, H, Dv)
    k_decay = torch.exp((T - 1 - n)[:, None] * log_gamma)  # (T, H): γ^{T−1−m}
    S_new = torch.einsum("bmhd,bmhe->bhde", k * k_decay[None, :, :, None], v)  # (B, H, Dk, Dv)
    if S is not None:
        q_decay = torch.exp((n + 1)[:, None] * log_gamma)  # (T, H): γ^{n+1}
        o = o + torch.einsum("bnhd,bhde->bnhe", q * q_decay[None, :, :, None], S)
        S_new = S_new + torch.exp(T * log_gamma)[None, :, None, None] * S
    return o, S_new
