"""The collectives of context parallelism, differentiable, and a count of the bytes they move.

`gather_shards(t, shard)` stacks every rank's ``t`` ``(world, *t.shape)``; its backward sums the gradients
every rank computed for each slot (one all-reduce) and hands each rank its own slot's sum. It runs on any
backend (gloo included): the forward is ``all_gather``, the backward ``all_reduce``.

Every rank must take part in every collective, in the same order, in forward and in backward. A rank whose
shard does not use what came in (rank 0 receives no carry; a shard that starts a document needs no halo) still
joins the backward through `keep_in_graph`, which returns its first argument unchanged and sends a zero
gradient to the others: their backward, and so the all-reduce, runs on that rank too.

`count_traffic()` records, while it is open, the bytes each collective brings into this rank (point to point: what
it receives; all-gather: ``(world − 1)·n``; a ring all-reduce of m bytes: ``2·(world − 1)/world·m``), forward and
backward apart.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Traffic", "count_traffic", "gather_shards", "keep_in_graph"]


@dataclass
class Traffic:
    """Bytes received by this rank, per direction, and per label (``"scan carry"``, ``"conv halo"``, …)."""

    forward: int = 0
    backward: int = 0
    by_label: dict = field(default_factory=dict)

    def add(self, label: str, direction: str, nbytes: int) -> None:
        setattr(self, direction, getattr(self, direction) + nbytes)
        key = (label, direction)
        self.by_label[key] = self.by_label.get(key, 0) + nbytes


_counters: list[Traffic] = []


@contextlib.contextmanager
def count_traffic():
    """``with count_traffic() as traffic: …``: the bytes this rank's collectives received meanwhile."""
    traffic = Traffic()
    _counters.append(traffic)
    try:
        yield traffic
    finally:
        _counters.remove(traffic)


def _record(label: str, direction: str, nbytes: int) -> None:
    for traffic in _counters:
        traffic.add(label, direction, int(nbytes))


class _GatherShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: Tensor, group, rank: int, world: int, label: str):
        ctx.group, ctx.rank, ctx.world, ctx.label = group, rank, world, label
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t, group=group)
        _record(label, "forward", (world - 1) * t.numel() * t.element_size())
        return torch.stack(parts)  # (world, *t.shape)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()  # (world, *t.shape): this rank's gradient for every rank's t
        dist.all_reduce(grad, group=ctx.group)
        _record(ctx.label, "backward", 2 * (ctx.world - 1) * grad.numel() * grad.element_size() // ctx.world)
        return grad[ctx.rank], None, None, None, None


def gather_shards(t: Tensor, shard, label: str = "gather") -> Tensor:
    """Every rank's ``t`` stacked in rank order, ``(world, *t.shape)`` (the same shape and dtype on every rank);
    differentiable in ``t``. One rank: ``t[None]``."""
    if shard.world == 1:
        return t.unsqueeze(0)
    return _GatherShards.apply(t, shard.group, shard.rank, shard.world, label)


class _KeepInGraph(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: Tensor, *others: Tensor):
        ctx.shapes = [(o.shape, o.dtype, o.device) for o in others]
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: Tensor):
        zeros = [torch.zeros((), dtype=dtype, device=device).expand(shape) for shape, dtype, device in ctx.shapes]
        return (grad, *zeros)


def keep_in_graph(y: Tensor, *others: Tensor) -> Tensor:
    """``y`` unchanged, with ``others`` joined to its graph: when the backward reaches ``y`` it sends a zero
    gradient to each of them, so the collectives behind them take part on this rank too."""
    others = tuple(o for o in others if isinstance(o, Tensor) and o.requires_grad)
    if not others or not torch.is_grad_enabled():
        return y
    return _KeepInGraph.apply(y, *others)
