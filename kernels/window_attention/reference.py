"""The plain dense-mask form of sliding-window attention: the ground truth for the other forms.

It materialises the `(T, S)` scores, so it is for tests and small sizes only.
"""
from __future__ import annotations

import torch
from torch import Tensor


def window_attention_reference(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float) -> Tensor:
    """o_i = Σ_{j ∈ W(i)} softmax_j(scale · q_iᵀ k_j) v_j,  W(i) = {j : p_i − w < j ≤ p_i},  p_i = S − T + i.

    q `(B, T, H, D)`; k, v `(B, S, G, D)` with S ≥ T, in position order, the queries' own tokens last (the
    first S − T keys are the tokens before them). Query head h reads kv head `h // (H/G)`. `window` None:
    causal attention over all S keys. Returns `(B, T, H, D)` in q's dtype, computed in q's dtype.
    """
    T, H, S, G = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    k = k.to(q.dtype).repeat_interleave(H // G, dim=2)  # (B, S, H, D)
    v = v.to(q.dtype).repeat_interleave(H // G, dim=2)  # (B, S, H, D)
    logits = torch.einsum("bihd,bjhd->bhij", q, k) * scale  # (B, H, T, S)
    i = (S - T + torch.arange(T, device=q.device))[:, None]  # (T, 1) query positions
    j = torch.arange(S, device=q.device)[None, :]  # (1, S) key positions
    allowed = (j <= i) & (j > i - window) if window is not None else j <= i  # (T, S)
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("bhij,bjhd->bihd", weights, v)  # (B, T, H, D)
