"""`vo_gla_cp`: the G mixer's op of one long sequence split across ranks, with the numbers of one rank.

    S_t = γ_t · (S_{t−1} turned by e^{−iθ_t} on the value pairs) + k_t ⊗ v_t,      o_t = q_t S_t

(per head; S is Dk × Dv in the frame of the last token, pair p of a value row is ``S[:, 2p] + i·S[:, 2p+1]``).

1. Each rank runs `vo_gla` on its shard from a zero state (its documents' own initial states where they start
   inside it): ``o⁰``, and ``F`` the state after its last token.
2. The shard's transition turns and decays every value pair alike: ``A = Γ·e^{−iΘ}`` per head and pair, with
   ``Γ = exp(Σ log γ)`` and ``Θ = Σ θ`` over the shard (sums in float64; zero when a document starts inside the
   shard), sent as the real pair ``(Γ cos Θ, −Γ sin Θ)``. ``(A, F)`` go to every rank in one exchange
   (``H·(Dk·Dv + Dv)`` numbers per row), and the exclusive scan over ranks gives the state ``S_in`` entering the
   shard (`carry.carry_in`).
3. The carry reaches the first piece: ``o_t = o⁰_t + Γ_{≤t}·e^{−iΘ_{≤t}} (q_t S_in)`` (cumulative from the
   shard's start, t included; the turn acts on value pairs, so it commutes with reading by q), and the first
   piece's final state gains ``Γ_{≤e}·e^{−iΘ_{≤e}} S_in``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..varlen import on_device
from ..vo_gla import DEFAULT_TILE_SIZE, vo_gla
from ..vo_gla.rotation import rotate
from .carry import carry_in
from .comm import keep_in_graph

__all__ = ["vo_gla_cp"]


def _turn(a: Tensor, s: Tensor) -> Tensor:
    """``A ∘ S``: S's value pairs times ``Γ e^{−iΘ}``; ``a`` ``(rows, H, 1, Dv)`` pairs interleaved
    ``(Γ cos Θ, −Γ sin Θ)``, ``s`` ``(rows, H, Dk, Dv)``."""
    return rotate(s, a[..., 0::2], a[..., 1::2])


def _per_token(t: Tensor, ndim: int) -> Tensor:
    """``t`` broadcastable to ``(B, L, H)`` (ndim 3) or ``(B, L, H, P)`` (ndim 4) as a view with all the axes,
    ``(B or 1, L or 1, …)``, in float64."""
    return t.double().reshape((1,) * (ndim - t.dim()) + tuple(t.shape))


def _cumulative(t: Tensor, n: int) -> Tensor:
    """``Σ_{u≤t}`` over the shard's first ``n`` tokens of a per-token view (`_per_token`): ``(B or 1, n, …)``,
    a static one (one token's value) summed as ``t·(u+1)``."""
    if t.shape[1] == 1:
        steps = torch.arange(1, n + 1, device=t.device, dtype=t.dtype)
        return t * steps.view((1, n) + (1,) * (t.dim() - 2))
    return t[:, :n].cumsum(1)


def _shard_sum(t: Tensor, length: int) -> Tensor:
    """``Σ`` over the shard's ``length`` tokens of a per-token view: ``(B or 1, …)``."""
    return length * t[:, 0] if t.shape[1] == 1 else t.sum(dim=1)


def _decay_and_turn(log_decay: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    """``(Γ cos Θ, −Γ sin Θ)`` from summed log decays ``(…, H)`` and angles ``(…, H, P)`` (float64): each
    ``(…, H, P)``, the real and imaginary parts of ``Γ e^{−iΘ}``."""
    gamma = torch.exp(log_decay)[..., None]
    return gamma * torch.cos(theta), -gamma * torch.sin(theta)


def vo_gla_cp(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, theta: Tensor, initial_state: Tensor | None = None,
              *, shard, output_final_state: bool = False, tile_size: int = DEFAULT_TILE_SIZE,
              backend: str | None = None, check_values: bool = True) -> tuple[Tensor, Tensor | None]:
    """`hybrid.kernels.vo_gla.vo_gla` on this rank's shard of the sequence (`SequenceShard`).

    q, k ``(B, L, H, Dk)``, v ``(B, L, H, Dv)`` (``(1, L, …)`` with packed documents); log_decay broadcastable to
    ``(B, L, H)``, theta to ``(B, L, H, Dv/2)``: static (``(H,)``, ``(H, Dv/2)``) or this shard's per-token values.
    initial_state: the state before the whole sequence ``(B, H, Dk, Dv)``, or per packed document
    ``(N, H, Dk, Dv)``; the same on every rank, read where its sequence starts (its gradient is a per-rank part).
    output_final_state: the state after this shard's last token (packed: after each local piece), as
    `complex_scan_cp`'s. tile_size, backend, check_values: as `vo_gla`'s. Returns ``(o, final or None)``, ``o``
    this shard's rows of one rank's.
    """
    shard.check_local("q", q)
    cu = shard.cu_seqlens
    local_init = initial_state
    if initial_state is not None and shard.packed:  # each piece that starts its document takes its own state
        local_init = initial_state[on_device(shard.piece_docs, initial_state.device)]  # (n, H, Dk, Dv)
        if shard.continues:
            local_init = torch.cat([torch.zeros_like(local_init[:1]), local_init[1:]])
    elif shard.continues:  # one sequence per row, begun on rank 0
        local_init = None
    run = dict(cu_seqlens=cu, tile_size=tile_size, backend=backend, check_values=check_values)
    if shard.world == 1:
        return vo_gla(q, k, v, log_decay, theta, local_init, output_final_state=output_final_state, **run)
    o, finals = vo_gla(q, k, v, log_decay, theta, local_init, output_final_state=True, **run)
    final = finals[-1:] if shard.packed else finals  # (B or 1, H, Dk, Dv): the state leaving the shard from zero
    rows, H, _, Dv = final.shape
    g, th = _per_token(log_decay, 3), _per_token(theta, 4)  # (B or 1, L or 1, H), (B or 1, L or 1, H, P)
    if shard.passes_through():
        re, im = _decay_and_turn(_shard_sum(g, shard.length), _shard_sum(th, shard.length))  # (B or 1, H, P) each
        transition = torch.stack((re, im), dim=-1).expand(rows, H, Dv // 2, 2)  # (rows, H, P, 2)
        transition = transition.reshape(rows, H, 1, Dv).to(final.dtype)  # pairs interleaved, one row per head
    else:  # a document starts inside the shard: nothing entering it leaves it
        transition = final.new_zeros(rows, H, 1, Dv)
    incoming, token = carry_in(transition, final, shard, _turn, "gla carry")
    if not shard.continues:
        return keep_in_graph(o, token), (finals if output_final_state else None)
    e = shard.first_piece_length
    sdt = incoming.dtype
    re, im = (part.to(sdt) for part in _decay_and_turn(_cumulative(g, e), _cumulative(th, e)))  # (B or 1, e, H, P)
    read = torch.einsum("bthd,bhde->bthe", q[:, :e].to(sdt), incoming)  # (B, e, H, Dv): q_t S_in
    carried = rotate(read, re, im)  # Γ_{≤t} e^{−iΘ_{≤t}} q_t S_in
    first = (o[:, :e].to(sdt) + carried).to(o.dtype)
    o = torch.cat([first, o[:, e:]], dim=1) if e < o.shape[1] else first
    if not output_final_state:
        return o, None
    entering = rotate(incoming, re[:, -1, :, None], im[:, -1, :, None])  # (rows, H, Dk, Dv): S_in at the piece's end
    finals = torch.cat([finals[:1] + entering, finals[1:]]) if shard.packed else finals + entering
    return o, finals
