"""The halo: the tokens just before a shard, for the mixers that look a fixed distance back (the causal conv's
W − 1 inputs, a window's w − 1 keys and values) or all the way back (global attention's keys and values).

Point to point: rank r receives from each earlier rank j the part of j's shard within ``size`` tokens of its
start, ``n(j → r) = clamp(size − (r − 1 − j)·L, 0, L)`` tokens from the end of shard j (the shards are equal, so
both sides know every count). A halo longer than a shard spans ``⌈size / L⌉`` ranks; global attention
(``size`` None) takes every earlier shard, O(T) memory per rank. The backward sends each halo token's gradient
back to the rank it came from, which adds it to its own. One ``batch_isend_irecv`` each way.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .comm import _record

__all__ = ["gather_halo"]


def _count(size: int, L: int, distance: int) -> int:
    """Tokens a rank receives from the rank ``distance`` (≥ 1) before it."""
    return max(0, min(L, size - (distance - 1) * L))


def _exchange(group, sends: list, recvs: list) -> None:
    """Post every send ``(tensor, group rank)`` and receive ``(buffer, group rank)`` at once, then wait."""
    ops = [dist.P2POp(dist.isend, t, dist.get_global_rank(group, peer) if group is not None else peer, group)
           for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, dist.get_global_rank(group, peer) if group is not None else peer, group)
            for t, peer in recvs]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


class _Halo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, size: int, group, rank: int, world: int, label: str):
        L = x.shape[1]
        ctx.size, ctx.group, ctx.rank, ctx.world, ctx.label, ctx.L = size, group, rank, world, label, L
        sends, recvs = [], []
        for distance in range(1, world):
            n = _count(size, L, distance)
            if n == 0:
                break
            if rank + distance < world:
                sends.append((x[:, L - n:].contiguous(), rank + distance))
            if rank - distance >= 0:
                recvs.append((x.new_empty((x.shape[0], n) + x.shape[2:]), rank - distance))
        _exchange(group, sends, recvs)
        _record(label, "forward", sum(t.numel() * t.element_size() for t, _ in recvs))
        pieces = [t for t, _ in reversed(recvs)]  # in position order: the farthest rank first
        return torch.cat(pieces, dim=1) if pieces else x.new_empty((x.shape[0], 0) + x.shape[2:])

    @staticmethod
    def backward(ctx, grad: Tensor):
        L, rank, world = ctx.L, ctx.rank, ctx.world
        sends, recvs, at = [], [], grad.shape[1]
        for distance in range(1, world):
            n = _count(ctx.size, L, distance)
            if n == 0:
                break
            if rank - distance >= 0:  # the halo's part from that rank goes back to it
                sends.append((grad[:, at - n:at].contiguous(), rank - distance))
                at -= n
            if rank + distance < world:  # the gradient of the tokens this rank sent forward
                shape = (grad.shape[0], n) + grad.shape[2:]
                recvs.append((grad.new_empty(shape), rank + distance))
        _exchange(ctx.group, sends, recvs)
        _record(ctx.label, "backward", sum(t.numel() * t.element_size() for t, _ in recvs))
        grad_x = grad.new_zeros((grad.shape[0], L) + grad.shape[2:])
        for t, _ in recvs:
            grad_x[:, L - t.shape[1]:] += t
        return grad_x, None, None, None, None, None


def gather_halo(x: Tensor, size: int | None, shard, *, before: Tensor | None = None,
                label: str = "halo") -> tuple[Tensor, Tensor | None]:
    """The ``size`` tokens (dim 1) before this rank's shard of ``x``; differentiable in ``x`` and ``before``.

    Args:
        x: ``(B, L, …)``, this rank's shard (the same shape on every rank).
        size: how many tokens back; None for all of them (global attention).
        before: ``(B, n, …)``, tokens before position 0 (a conv's initial state), the same on every rank; None
            when the sequence has nothing before it.
    Returns:
        ``(halo, token)``: ``halo`` ``(B, h, …)`` in position order, ``h = min(size, start + n)`` (0 on rank 0
        without ``before``), and the exchanged part for `comm.keep_in_graph` (None on one rank): every rank must
        take part in the exchange's backward.
    """
    want = shard.start if size is None else size  # `before` may reach further back than the sequence's start
    token = None
    pieces = []
    if before is not None and want > shard.start:  # it reaches past position 0
        pieces.append(before.to(x.dtype))
    if shard.world > 1:
        token = _Halo.apply(x, shard.total if size is None else size, shard.group, shard.rank, shard.world, label)
        pieces.append(token)
    if not pieces:
        return x[:, :0], token
    halo = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]  # (B, n + …, …), ending at the shard start
    return halo[:, max(0, halo.shape[1] - want):], token
