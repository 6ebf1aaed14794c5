"""The torch form of the causal depthwise conv: `F.conv1d(groups=C)` over `[tail; x]`, any device and dtype.

Packed sequences (`cu_seqlens`): the sequences and their tails are laid end to end in one stream,
`[tail_0; x_0; tail_1; x_1; …]` (`(total_T + N·(W−1), C)`, one gather), the conv runs once over the stream and
each token's output is read back from its slot. A token's taps reach W−1 slots back, into its own sequence or
its own tail, never across a boundary; no per-sequence Python loop. The final states are the last W−1 slots of
each sequence's block: its last inputs, or the tail of `[initial state; inputs]` when it is shorter than W−1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..varlen import sequence_ids


def conv_valid(u: Tensor, weight: Tensor, bias: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """u `(B, L, C)` → `(B, L − W + 1, C)`: the depthwise conv at every slot whose W taps lie inside u,
    computed in the promoted dtype of u and weight, returned in `out_dtype`."""
    C = u.shape[-1]
    dt = torch.promote_types(u.dtype, weight.dtype)
    bias = None if bias is None else bias.to(dt)
    y = F.conv1d(u.transpose(1, 2).to(dt), weight.to(dt).unsqueeze(1), bias, groups=C)  # (B, C, L − W + 1)
    return y.transpose(1, 2).to(out_dtype)


def tail_stream(cu_seqlens: Tensor, total: int, width: int):
    """Index maps of the stream `[tail_0; x_0; tail_1; x_1; …]` of N packed sequences (K = W − 1 tail slots each).

    Returns `gather` `(total + N·K,)`: for each stream slot, its row in `[tails (N·K rows); x (total rows)]`;
    `token_slot` `(total,)`: the stream slot of each token; `final_slot` `(N, K)`: the last K slots of each
    sequence's block (its final state).
    """
    K, N = width - 1, cu_seqlens.numel() - 1
    cu = cu_seqlens.long()
    dev = cu.device
    n = torch.arange(N, device=dev)
    token_slot = torch.arange(total, device=dev) + (sequence_ids(cu, total) + 1) * K  # (total,)
    tail_slot = ((cu[:-1] + n * K)[:, None] + torch.arange(K, device=dev)).flatten()  # (N·K,)
    gather = torch.empty(total + N * K, dtype=torch.long, device=dev)
    gather[tail_slot] = torch.arange(N * K, device=dev)
    gather[token_slot] = N * K + torch.arange(total, device=dev)
    final_slot = (cu[1:] + (n + 1) * K)[:, None] - K + torch.arange(K, device=dev)  # (N, K)
    return gather, token_slot, final_slot


def packed_stream(x: Tensor, initial_state: Tensor | None, cu_seqlens: Tensor, width: int):
    """u `(1, total + N·(W−1), C)` = `[tail_0; x_0; tail_1; x_1; …]` (tails zeros where `initial_state` is None),
    with the `token_slot` and `final_slot` maps of `tail_stream`. Differentiable in x and initial_state."""
    T, C = x.shape[1], x.shape[2]
    K, N = width - 1, cu_seqlens.numel() - 1
    gather, token_slot, final_slot = tail_stream(cu_seqlens, T, width)
    tails = x.new_zeros(N * K, C) if initial_state is None else initial_state.to(x.dtype).reshape(N * K, C)
    u = torch.cat([tails, x[0]], dim=0).index_select(0, gather)  # (total + N·K, C)
    return u.unsqueeze(0), token_slot, final_slot


def causal_conv1d_torch(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, initial_state: Tensor | None = None, *,
    output_final_state: bool = False, cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Same contract as `causal_conv1d_reference`."""
    B, T, C = x.shape
    W = weight.shape[1]
    if cu_seqlens is None:
        tail = x.new_zeros(B, W - 1, C) if initial_state is None else initial_state.to(x.dtype)
        u = torch.cat([tail, x], dim=1)  # (B, W−1+T, C)
        return conv_valid(u, weight, bias, x.dtype), (u[:, T:] if output_final_state else None)
    u, token_slot, final_slot = packed_stream(x, initial_state, cu_seqlens, W)  # (1, L, C)
    y = conv_valid(u, weight, bias, x.dtype)[:, token_slot - (W - 1)]  # (1, T, C): slot s reads y_u[s − (W−1)]
    final = u[0, final_slot.flatten()].view(*final_slot.shape, C) if output_final_state else None  # (N, W−1, C)
    return y, final
