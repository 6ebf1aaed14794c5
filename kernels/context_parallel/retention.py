"""`retention_cp`: retention of one long sequence split across ranks, with the numbers of one rank.

    S_t = γ S_{t−1} + k_tᵀ v_t,      o_t = q_t S_t          (per head; S is Dk × Dv)

1. Each rank runs the chunkwise form on its shard from a zero state (its documents' own initial states where
   they start inside it): ``o⁰``, and ``F`` the state after its last token.
2. The shard's transition is ``γ^L`` per head (zero when a document starts inside the shard); ``(γ^L, F)`` go
   to every rank in one exchange (``H·(Dk·Dv + 1)`` numbers per row), and the exclusive scan over ranks gives
   the state ``S_in`` entering the shard (`carry.carry_in`).
3. The carry reaches the first piece: ``o_t = o⁰_t + γ^{t+1} q_t S_in`` (t counted from the shard's start), the
   chunkwise form's own inter-tile term.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..retention import DEFAULT_TILE_SIZE, retention_chunkwise
from ..varlen import on_device
from .carry import carry_in
from .comm import keep_in_graph

__all__ = ["retention_cp"]


def _decay_heads(a: Tensor, s: Tensor) -> Tensor:
    """``γ^L ∘ S``: ``a`` ``(rows, H, 1, 1)``, ``s`` ``(rows, H, Dk, Dv)``."""
    return a * s


def retention_cp(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, initial_state: Tensor | None = None, *, shard,
                 output_final_state: bool = False, tile_size: int = DEFAULT_TILE_SIZE) -> tuple[Tensor, Tensor | None]:
    """`hybrid.kernels.retention.retention_chunkwise` on this rank's shard of the sequence (`SequenceShard`).

    q, k ``(B, L, H, Dk)``, v ``(B, L, H, Dv)`` (``(1, L, …)`` with packed documents), log_gamma ``(H,)``.
    initial_state: the state before the whole sequence ``(B, H, Dk, Dv)``, or per packed document
    ``(N, H, Dk, Dv)``; the same on every rank, read where its sequence starts (its gradient is a per-rank part).
    output_final_state: the state after this shard's last token (packed: after each local piece), as
    `complex_scan_cp`'s. Returns ``(o, final or None)``, ``o`` this shard's rows of one rank's.
    """
    shard.check_local("q", q)
    cu = shard.cu_seqlens
    local_init = initial_state
    if initial_state is not None and shard.packed:
        local_init = initial_state[on_device(shard.piece_docs, initial_state.device)]  # (n, H, Dk, Dv)
        if shard.continues:
            local_init = torch.cat([torch.zeros_like(local_init[:1]), local_init[1:]])
    elif shard.continues:
        local_init = None
    if shard.world == 1:
        return retention_chunkwise(q, k, v, log_gamma, local_init, output_final_state=output_final_state,
                                   cu_seqlens=cu, tile_size=tile_size, check_values=False)
    o, finals = retention_chunkwise(q, k, v, log_gamma, local_init, output_final_state=True, cu_seqlens=cu,
                                    tile_size=tile_size, check_values=False)
    final = finals[-1:] if shard.packed else finals  # (B or 1, H, Dk, Dv)
    rows, H = final.shape[:2]
    lg = log_gamma.to(final.dtype)
    if shard.passes_through():
        transition = torch.exp(shard.length * lg).view(1, H, 1, 1).expand(rows, H, 1, 1)
    else:
        transition = final.new_zeros(rows, H, 1, 1)
    incoming, token = carry_in(transition, final, shard, _decay_heads, "retention carry")
    if not shard.continues:
        return keep_in_graph(o, token), (finals if output_final_state else None)
    e = shard.first_piece_length
    t = torch.arange(1, e + 1, device=q.device, dtype=lg.dtype)
    q_decay = torch.exp(t[:, None] * lg)  # (e, H): γ^{t+1}
    carried = torch.einsum("bthd,bhde->bthe", q[:, :e].to(lg.dtype) * q_decay[None, :, :, None], incoming)
    first = (o[:, :e].to(carried.dtype) + carried).to(o.dtype)  # (B, e, H, Dv)
    o = torch.cat([first, o[:, e:]], dim=1) if e < o.shape[1] else first
    if not output_final_state:
        return o, None
    entering = torch.exp(e * lg).view(1, H, 1, 1) * incoming  # γ^e S_in: the carry at the first piece's end
    finals = torch.cat([finals[:1] + entering, finals[1:]]) if shard.packed else finals + entering
    return o, finals
