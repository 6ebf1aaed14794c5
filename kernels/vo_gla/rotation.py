"""Rotating value pairs, in real arithmetic: pair p of a vector x is the complex number ``x[2p] + i·x[2p+1]``.

    rotate(x, cos φ, sin φ) = x · e^{iφ}        per pair: (a cos φ − b sin φ, a sin φ + b cos φ)

The inverse rotation is ``rotate(x, cos φ, −sin φ)``. Real arithmetic, so autograd, torch.compile and every
backend see plain tensors.

``sequence_phase`` gives the absolute phase ``Φ_t = Σ_{s≤t} θ_s`` (restarting at each sequence) that the fla
adapter needs: summed in float64 and wrapped to ``[0, 2π)`` before it is rounded to float32, so that a long
sequence keeps float32's angle precision (a phase of 10⁵ rad in float32 would be off by up to 0.004 rad).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` ``(…, 2P)`` times ``e^{iφ}`` per pair; ``cos``, ``sin`` broadcastable to ``(…, P)``."""
    pairs = x.unflatten(-1, (-1, 2))  # (…, 2P) -> (…, P, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)  # (…, P, 2) -> (…, 2P)


def sequence_phase(theta: Tensor, T: int, cu_seqlens: Tensor | None) -> Tensor:
    """``Φ_t = Σ_{s ≤ t, s in t's sequence} θ_s`` wrapped to ``[0, 2π)``, in θ's dtype.

    theta: ``(Bd, Td, H, P)`` with Td ∈ {1, T} (1: the same angle at every token); cu_seqlens: None (each row
    one sequence) or ``(N+1,)`` offsets of a packed row. Returns ``(Bd, T, H, P)``."""
    device = theta.device
    th = theta.double()
    if th.shape[1] == 1:  # static: Φ_t = θ · (p_t + 1), p_t the position in t's sequence
        pos = torch.arange(T, device=device)
        if cu_seqlens is not None:
            seq = torch.searchsorted(cu_seqlens[1:].contiguous(), pos, right=True)  # (T,)
            pos = pos - cu_seqlens.long()[seq]
        phase = th * (pos + 1).double()[None, :, None, None]
    else:
        phase = th.cumsum(1)  # (Bd, T, H, P)
        if cu_seqlens is not None:  # subtract what was summed before each sequence's first token
            before = torch.cat([phase.new_zeros(phase.shape[0], 1, *phase.shape[2:]), phase], dim=1)
            pos = torch.arange(T, device=device)
            seq = torch.searchsorted(cu_seqlens[1:].contiguous(), pos, right=True)
            phase = phase - before[:, cu_seqlens.long()[seq]]
    return torch.remainder(phase, 2 * math.pi).to(theta.dtype)
