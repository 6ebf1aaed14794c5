"""The recurrent form of retention: one token.

    S_t = γ S_{t−1} + k_tᵀ v_t,      o_t = q_t S_t
"""
from __future__ import annotations

import torch
from torch import Tensor


def retention_step(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, state: Tensor | None = None):
    """q, k: ``(B, H, Dk)``; v: ``(B, H, Dv)``; log_gamma: ``(H,)``; state: ``(B, H, Dk, Dv)`` or None (zeros),
    the state after the previous token of each row's sequence (one sequence per row: no cu_seqlens here).

    Returns ``o_t`` ``(B, H, Dv)`` and ``S_t`` ``(B, H, Dk, Dv)``.
    """
    kv = k[..., :, None] * v[..., None, :]  # (B, H, Dk, Dv)
    S_new = kv if state is None else torch.exp(log_gamma)[None, :, None, None] * state + kv
    return torch.einsum("bhd,bhde->bhe", q, S_new), S_new
