"""The plain dense-mask form of causal (sliding-window) attention: the ground truth for the other forms.

It materialises the `(T, S)` scores, so it is for tests and small sizes only.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..varlen import device_offsets
from .varlen import query_key_positions


def window_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float,
    cu_seqlens: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
) -> Tensor:
    """o_i = Σ_{j ∈ W(i)} softmax_j(scale · q_iᵀ k_j) v_j, W(i) = {j : p_i − w < j ≤ p_i}, p_i = S − T + i.

    q `(B, T, H, D)`; k, v `(B, S, G, D)` with S ≥ T, in position order, the queries' own tokens last (the
    first S − T keys are the tokens before them). Query head h reads kv head `h // (H/G)`. `window` None:
    causal attention over all S keys. Packed (B = 1): the same per sequence, queries offset by `cu_seqlens`,
    keys by `cu_seqlens_k` (default `cu_seqlens`), never across sequences (see `varlen.py`). Returns
    `(B, T, H, D)` in q's dtype, computed in q's dtype.
    """
    T, H, S, G = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    k = k.to(q.dtype).repeat_interleave(H // G, dim=2)  # (B, S, H, D)
    v = v.to(q.dtype).repeat_interleave(H // G, dim=2)  # (B, S, H, D)
    logits = torch.einsum("bihd,bjhd->bhij", q, k) * scale  # (B, H, T, S)
    if cu_seqlens is None:  # one sequence per batch row
        cu_seqlens, cu_seqlens_k = torch.tensor([0, T]), torch.tensor([0, S])
    elif cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens = device_offsets(cu_seqlens)
    else:
        cu_seqlens, cu_seqlens_k = device_offsets(cu_seqlens), device_offsets(cu_seqlens_k)
    seq_q, pos_q, seq_k, pos_k = query_key_positions(cu_seqlens.to(q.device), cu_seqlens_k.to(q.device), T, S)
    i, j = pos_q[:, None], pos_k[None, :]  # (T, 1) query positions, (1, S) key positions, per sequence
    allowed = (seq_q[:, None] == seq_k[None, :]) & (j <= i)  # (T, S)
    if window is not None:
        allowed &= j > i - window
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("bhij,bjhd->bihd", weights, v)  # (B, T, H, D)
