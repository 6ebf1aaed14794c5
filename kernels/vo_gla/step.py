"""The recurrent form of vo_gla, one token, in plain torch:

    S_t = γ_t · (S_{t−1} e^{−iθ_t} on the value pairs) + k_t ⊗ v_t,      o_t = q_t S_t

The state is kept in the frame of the last token seen, so it holds no position: the rotation that the parallel
form writes as ``R_{Φ_j − Φ_t}`` is applied to the state one step at a time.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .rotation import rotate


def vo_gla_step_torch(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, theta: Tensor,
                      state: Tensor | None) -> tuple[Tensor, Tensor]:
    """q, k ``(B, H, Dk)``, v ``(B, H, Dv)``, log_decay ``(B, H)``, theta ``(B, H, Dv/2)``, state ``(B, H, Dk, Dv)``
    or None (zeros), all in the state dtype: ``o_t`` ``(B, H, Dv)`` and ``S_t`` ``(B, H, Dk, Dv)``."""
    kv = k[..., :, None] * v[..., None, :]  # (B, H, Dk, Dv)
    if state is None:
        S = kv
    else:
        turned = rotate(state, torch.cos(theta)[:, :, None], -torch.sin(theta)[:, :, None])  # e^{−iθ} per pair
        S = torch.exp(log_decay)[..., None, None] * turned + kv
    return torch.einsum("bhd,bhde->bhe", q, S), S
