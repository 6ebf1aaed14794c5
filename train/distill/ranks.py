"""What ``hybrid-distill`` does across torchrun ranks (``hybrid.train.parallel.distributed.DistEnv``); each is a no-op on one
process.

- ``broadcast_weights``: rank 0's weights and buffers to every rank (as DDP does when it wraps a model);
- ``average_gradients``: the trainable gradients averaged across the ranks after a backward pass (DDP's update),
  in flat all-reduce buckets of at most ``BUCKET`` elements per dtype and device;
- ``sum_over_ranks``: float64 sums of a few figures (validation losses and counts).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["BUCKET", "broadcast_weights", "average_gradients", "sum_over_ranks"]

BUCKET = 1 << 24  # elements per gradient all-reduce (64 MB of float32)


def broadcast_weights(env, model: torch.nn.Module) -> None:
    """Every rank's ``model`` state (weights and buffers) becomes rank 0's."""
    if env.distributed:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)


def average_gradients(env, params) -> None:
    """``p.grad`` of every parameter in ``params`` that has one, replaced by its mean over the ranks."""
    if not env.distributed:
        return
    buckets: dict = {}
    for g in (p.grad for p in params if p.grad is not None):
        group = buckets.setdefault((g.dtype, g.device), [[]])
        if group[-1] and sum(t.numel() for t in group[-1]) + g.numel() > BUCKET:
            group.append([])
        group[-1].append(g)
    for bucket in (b for group in buckets.values() for b in group):
        flat = torch.cat([g.reshape(-1) for g in bucket])  # (Σ numel,)
        dist.all_reduce(flat)
        flat /= env.world_size
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def sum_over_ranks(env, values, device) -> list[float]:
    """``values`` summed over the ranks in float64 (themselves on one process)."""
    if not env.distributed:
        return list(values)
    return env.all_reduce(torch.tensor(list(values), dtype=torch.float64, device=device)).tolist()
