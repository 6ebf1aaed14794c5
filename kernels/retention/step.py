"""The recurrent form of retention: one token.

    S_t = γ S_{t−1} + k_tᵀ v_t,      o_t = q_t S_t
"""
from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_decay_values, decay_argument


def retention_step(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None = None, state: Tensor | None = None, *,
                   log_gamma: Tensor | None = None, check_values: bool = True):
    """q, k: ``(B, H, Dk)``; v: ``(B, H, Dv)``; log_decay: ``(H,)``; state: ``(B, H, Dk, Dv)`` or None (zeros),
    the state after the previous token of each row's sequence (one sequence per row: no cu_seqlens here).

    Returns ``o_t`` ``(B, H, Dv)`` and ``S_t`` ``(B, H, Dk, Dv)``. ``log_gamma``: ``log_decay``'s old name (it still
    works). ``check_values``: check ``log_decay`` finite and ≤ 0 (one device sync; the model passes False).
    """
    log_decay = decay_argument(log_decay, log_gamma, "retention_step")
    if check_values:
        check_decay_values(log_decay)
    kv = k[..., :, None] * v[..., None, :]  # (B, H, Dk, Dv)
    S_new = kv if state is None else torch.exp(log_decay)[None, :, None, None] * state + kv
    return torch.einsum("bhd,bhde->bhe", q, S_new), S_new
