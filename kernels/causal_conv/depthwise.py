"""The torch form of the causal depthwise conv: `F.conv1d(groups=C)` over `[tail; x]`, any device and dtype.

Packed sequences (`cu_seqlens`): the sequences and their tails are laid end to end in one stream,
`[tail_0; x_0; tail_1; x_1; …]` (`(total_T + N·(W−1), C)`, one gather), the conv runs once over the stream and
each token's output is read back from its slot. A token's taps reach W−1 slots back, into its own sequence or
its own tail, never across a boundary; no per-sequence Python loop. The final states are the last W−1 slots of
each sequence's block: its last inputs, or the tail of `[initial state; inputs]` when it is shorter than W−1.
Under torch.compile, packed sequences from zero states without final states (training) take `packed_taps`,
whose shapes do not depend on N.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..varlen import positions_in_sequence, sequence_ids


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


def packed_taps(x: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor) -> Tensor:
    """y `(1, T, C)` of packed sequences from zero states, as W shifted and masked products (tap j, j tokens back,
    kept where the token is at least j into its sequence): every shape is (T, C), whatever N. The stream form's
    `total + N·(W−1)` slots are a shape in N, and Inductor's lowering of the conv's backward fixes it: one graph per
    document count under torch.compile, which takes this form (Inductor fuses the W products into one kernel)."""
    T, W = x.shape[1], weight.shape[1]
    dt = torch.promote_types(x.dtype, weight.dtype)
    pos = positions_in_sequence(cu_seqlens, T)[:, None]  # (T, 1): each token's place in its sequence
    xs = x[0].to(dt)  # (T, C)
    w = weight.to(dt)
    y = xs * w[:, W - 1] if bias is None else bias.to(dt) + xs * w[:, W - 1]
    for j in range(1, W):
        back = F.pad(xs, (0, 0, j, 0))[:T]  # (T, C): x[t − j], zeros before the row
        y = y + torch.where(pos >= j, back, 0) * w[:, W - 1 - j]
    return y.to(x.dtype).unsqueeze(0)


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
    if initial_state is None and not output_final_state and torch.compiler.is_compiling():  # compiled training
        return packed_taps(x, weight, bias, cu_seqlens), None
    u, token_slot, final_slot = packed_stream(x, initial_state, cu_seqlens, W)  # (1, L, C)
    y = conv_valid(u, weight, bias, x.dtype)[:, token_slot - (W - 1)]  # (1, T, C): slot s reads y_u[s − (W−1)]
    final = u[0, final_slot.flatten()].view(*final_slot.shape, C) if output_final_state else None  # (N, W−1, C)
    return y, final
