"""The parallel form of retention, written as the formula reads: the ground truth for the other forms.

    o_n = Σ_{m≤n} γ^{n−m} (q_n · k_m) v_m + γ^{n+1} q_n S,      S' = γ^T S + Σ_m γ^{T−1−m} k_mᵀ v_m

It builds the ``(H, T, T)`` decay matrix ``Dec[n, m] = exp((n − m)·log γ)`` (m ≤ n, else 0; no division,
nothing overflows, far entries underflow to 0) and the ``(B, H, T, T)`` scores: O(T²) time and memory.
With ``cu_seqlens`` it splits the packed batch and runs each sequence alone (a Python loop: obviously
correct, an independent check of the chunkwise form's masks). Tests run it in float64; models use
``retention_chunkwise``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..varlen import host_offsets
from .checks import check_cu_seqlens, check_decay_values, check_qkv, check_state, decay_argument, state_dtype


def _parallel(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, S: Tensor | None):
    """One sequence per batch row, in the state dtype: o ``(B, T, H, Dv)``, S' ``(B, H, Dk, Dv)``."""
    T = q.shape[1]
    n = torch.arange(T, device=q.device, dtype=log_decay.dtype)
    diff = n[:, None] - n[None, :]  # (T, T): n − m
    decay = torch.exp(diff.clamp(min=0)[None] * log_decay[:, None, None])  # (H, T, T)
    decay = decay.masked_fill(diff[None] < 0, 0.0)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * decay  # (B, H, T, T)
    o = torch.einsum("bhnm,bmhe->bnhe", scores, v)  # (B, T, H, Dv)
    k_decay = torch.exp((T - 1 - n)[:, None] * log_decay)  # (T, H): γ^{T−1−m}
    S_new = torch.einsum("bmhd,bmhe->bhde", k * k_decay[None, :, :, None], v)  # (B, H, Dk, Dv)
    if S is not None:
        q_decay = torch.exp((n + 1)[:, None] * log_decay)  # (T, H): γ^{n+1}
        o = o + torch.einsum("bnhd,bhde->bnhe", q * q_decay[None, :, :, None], S)
        S_new = S_new + torch.exp(T * log_decay)[None, :, None, None] * S
    return o, S_new


def retention_reference(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None = None,
                        initial_state: Tensor | None = None, *, output_final_state: bool = False,
                        cu_seqlens: Tensor | None = None, log_gamma: Tensor | None = None):
    """q, k: ``(B, T, H, Dk)``; v: ``(B, T, H, Dv)``; log_decay: ``(H,)``; initial_state: ``(B, H, Dk, Dv)``, or
    ``(N, H, Dk, Dv)`` with cu_seqlens ``(N+1,)`` (a packed ``(1, total_T, …)`` batch), or None (zeros).

    Returns ``o`` ``(B, T, H, Dv)`` (q's dtype) and, when output_final_state, the state after each sequence
    ``(B or N, H, Dk, Dv)`` (float32; float64 for float64 inputs), else None. ``log_gamma``: ``log_decay``'s old
    name (it still works). ``log_decay`` must be finite and ≤ 0 (checked: one read back).
    """
    log_decay = decay_argument(log_decay, log_gamma, "retention_reference")
    check_qkv(q, k, v, log_decay)
    check_decay_values(log_decay)
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    sdt = state_dtype(q.dtype)
    q32, k32, v32, lg = (x.to(sdt) for x in (q, k, v, log_decay))
    S = None if initial_state is None else initial_state.to(sdt)
    if cu_seqlens is None:
        check_state(initial_state, "initial_state", (B, H, Dk, Dv), q)
        o, final = _parallel(q32, k32, v32, lg, S)
    else:
        cu = host_offsets(check_cu_seqlens(cu_seqlens, q))
        check_state(initial_state, "initial_state", (len(cu) - 1, H, Dk, Dv), q, "(N, H, Dk, Dv)")
        outs, finals = [], []
        for n, (a, b) in enumerate(zip(cu, cu[1:])):  # each sequence alone
            o_n, f_n = _parallel(q32[:, a:b], k32[:, a:b], v32[:, a:b], lg, None if S is None else S[n:n + 1])
            outs.append(o_n)
            finals.append(f_n)
        o, final = torch.cat(outs, dim=1), torch.cat(finals, dim=0)
    return o.to(q.dtype), (final if output_final_state else None)
