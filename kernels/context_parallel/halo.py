"""The halo: the tokens just before a shard, for the mixers that look a fixed distance back (the causal conv's
W − 1 inputs, a window's w − 1 keys and values) or all the way back (global attention's keys and values).

Every rank sends the last ``min(size, L)`` tokens of its shard (all of it when ``size ≥ L``: a halo longer than
a shard spans several ranks) in one differentiable all-gather; rank r keeps the last ``size`` tokens before its
start. So a window of w ≥ L brings ``min(w − 1, r·L)`` tokens from up to ``⌈(w − 1)/L⌉`` earlier ranks, and
global attention (``size`` = ∞) brings every earlier shard: O(T) memory per rank.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .comm import gather_shards

__all__ = ["gather_halo"]


def gather_halo(x: Tensor, size: int | None, shard, *, before: Tensor | None = None,
                label: str = "halo") -> tuple[Tensor, Tensor | None]:
    """The ``size`` tokens (dim 1) before this rank's shard of ``x``.

    Args:
        x: ``(B, L, …)``, this rank's shard (the same shape on every rank).
        size: how many tokens back; None for all of them (global attention).
        before: ``(B, n, …)``, tokens before position 0 (a conv's initial state), the same on every rank; None
            when the sequence has nothing before it.
    Returns:
        ``(halo, token)``: ``halo`` ``(B, h, …)`` in position order, ``h = min(size, start + n)`` (0 on rank 0
        without ``before``), and the gathered tensor for `comm.keep_in_graph` (None on one rank).
    """
    L = x.shape[1]
    want = shard.start if size is None else size
    tail = L if size is None else min(size, L)
    first = max(0, shard.rank - -(-want // L))  # the earliest rank the halo reaches
    token, pieces = None, []
    if before is not None and want > shard.start:  # it reaches past position 0
        pieces.append(before.to(x.dtype))
    if shard.world > 1:
        token = gather_shards(x[:, L - tail:], shard, label)  # (world, B, tail, …)
        pieces += [token[j] for j in range(first, shard.rank)]
    if not pieces:
        return x[:, :0], token
    halo = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]  # (B, n + …, …), ending at the shard start
    return halo[:, max(0, halo.shape[1] - want):], token
