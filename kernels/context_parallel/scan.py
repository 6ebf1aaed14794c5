"""`complex_scan_cp`: the complex scan of one long sequence split across ranks, with the numbers of one rank.

    s_t = a_t · s_{t−1} + x_t,      a_t = exp(log_decay_t − i·theta_t),      y_t = s_t

1. Each rank scans its shard from a zero state (its documents' own initial states where they start inside it):
   ``y⁰``, and ``F`` the state at its last token.
2. The shard's transition ``A = Π_t a_t = exp(Σ log_decay − i·Σ theta)`` (sums in float64; zero when a document
   starts inside the shard) and ``F`` go to every rank in one exchange; the exclusive scan over ranks gives the
   state ``S_in`` entering the shard (`carry.carry_in`).
3. The carry reaches the tokens of the first piece (up to the first document start): ``y_t = y⁰_t + P_t·S_in``
   with ``P_t = Π_{u≤t} a_u``, computed by the scan itself from ``S_in`` over zero inputs (the same arithmetic as
   one rank's, and the restart of a document stops it exactly).

The backward is autograd's through these steps; the exchange's backward brings each rank the adjoint of its
``(A, F)`` from the later ranks (`comm.gather_shards`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..complex_scan import complex_scan
from ..complex_scan.checks import state_dtype
from ..varlen import on_device
from .carry import carry_in
from .comm import keep_in_graph

__all__ = ["complex_scan_cp"]


def _complex_times(a: Tensor, s: Tensor) -> Tensor:
    """``a · s`` per rotary pair, both ``(…, D)`` with pairs interleaved (real, imaginary)."""
    ar, ai, sr, si = a[..., 0::2], a[..., 1::2], s[..., 0::2], s[..., 1::2]
    return torch.stack((ar * sr - ai * si, ar * si + ai * sr), dim=-1).flatten(-2)


def _as_4d(t) -> Tensor:
    """``t`` broadcastable to ``(B, L, H, P)`` as a 4-D view ``(B or 1, L or 1, H or 1, P or 1)``."""
    t = torch.as_tensor(t)
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


def _shard_sum(t, length: int) -> Tensor:
    """Σ over the shard's ``length`` tokens of ``t`` (broadcastable to ``(B, L, H, P)``), in float64:
    ``(B or 1, H, P)``."""
    t = _as_4d(t).double()
    return length * t[:, 0] if t.shape[1] == 1 else t.sum(dim=1)


def _first_tokens(t, n: int) -> Tensor:
    """The first ``n`` tokens of ``t`` (broadcastable to ``(B, L, H, P)``); a static one as it is."""
    t = _as_4d(t)
    return t if t.shape[1] == 1 else t[:, :n]


def complex_scan_cp(x: Tensor, log_decay: Tensor, theta: Tensor, initial_state: Tensor | None = None, *, shard,
                    output_final_state: bool = False, backend: str | None = None, block_size: int | None = None,
                    check_values: bool = True) -> tuple[Tensor, Tensor | None]:
    """`hybrid.kernels.complex_scan` on this rank's shard of the sequence (`SequenceShard`).

    Args:
        x: ``(B, L, H, D)``, the shard (``(1, L, H, D)`` with packed documents: ``shard.packed``).
        log_decay, theta: broadcastable to ``(B, L, H, D/2)``: static, or this shard's per-token values.
        initial_state: the state before the whole sequence, ``(B, H, D)``, or per packed document ``(N, H, D)``
            (N of the global offsets); the same on every rank, read where its sequence starts. Its gradient, as a
            parameter's, is a per-rank part: the sum over the ranks is the one-rank gradient.
        output_final_state: also return the state after this shard's last token, ``(B, H, D)`` (on the last rank:
            the final state); packed, the state after each local piece ``(n, H, D)`` (a piece that ends its
            document: that document's final state).
        backend, block_size, check_values: as `complex_scan`'s.
    Returns:
        ``(y, final or None)``: ``y`` ``(B, L, H, D)`` equal to this shard's rows of one rank's ``y``.
    """
    shard.check_local("x", x)
    cu = shard.cu_seqlens
    local_init = initial_state
    if initial_state is not None and shard.packed:  # each piece that starts its document takes its own state
        local_init = initial_state[on_device(shard.piece_docs, initial_state.device)]  # (n, H, D)
        if shard.continues:
            local_init = torch.cat([torch.zeros_like(local_init[:1]), local_init[1:]])
    elif shard.continues:  # one sequence per row, begun on rank 0
        local_init = None
    if shard.world == 1:
        return complex_scan(x, log_decay, theta, local_init, output_final_state=output_final_state, cu_seqlens=cu,
                            backend=backend, block_size=block_size, check_values=check_values)
    y, finals = complex_scan(x, log_decay, theta, local_init, output_final_state=True, cu_seqlens=cu,
                             backend=backend, block_size=block_size, check_values=check_values)
    final = finals[-1:] if shard.packed else finals  # (B or 1, H, D): the state leaving the shard from zero
    rows, H, D = final.shape
    if shard.passes_through():
        a = torch.exp(torch.complex(_shard_sum(log_decay, shard.length), -_shard_sum(theta, shard.length)))
        a = a.expand(rows, H, D // 2)  # (B or 1, H, P) complex128
        transition = torch.view_as_real(a).reshape(rows, H, D).to(final.dtype)  # (B or 1, H, P, 2) -> (.., H, D)
    else:  # a document starts inside the shard: nothing entering it leaves it
        transition = final.new_zeros(rows, H, D)
    incoming, token = carry_in(transition, final, shard, _complex_times, "scan carry")
    if not shard.continues:
        return keep_in_graph(y, token), (finals if output_final_state else None)
    e = shard.first_piece_length
    zeros = x.new_zeros((x.shape[0], e) + x.shape[2:], dtype=state_dtype(x.dtype))
    carried, _ = complex_scan(zeros, _first_tokens(log_decay, e), _first_tokens(theta, e), incoming,
                              backend=backend, block_size=block_size, check_values=False)  # (B, e, H, D): P_t·S_in
    first = (y[:, :e].to(carried.dtype) + carried).to(y.dtype)
    y = torch.cat([first, y[:, e:]], dim=1) if e < y.shape[1] else first
    if not output_final_state:
        return y, None
    finals = torch.cat([finals[:1] + carried[:, -1], finals[1:]]) if shard.packed else finals + carried[:, -1]
    return y, finals
