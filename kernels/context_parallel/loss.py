"""The loss of a sequence split across ranks: the mean over every token of every rank.

Each rank sums its tokens' losses and counts them; the count is all-reduced (no gradient), and each rank's
share of the mean is ``sum_r / count``. The shares add up to the global mean, and each rank's backward of its
share gives its part of the gradient: the parameters' gradients, summed over the context-parallel ranks, are
one rank's gradients of the mean (sum them, do not average them, over the ranks of one sequence).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["global_token_mean"]


def global_token_mean(loss_sum: Tensor, count, shard) -> tuple[Tensor, Tensor]:
    """``(share, mean)``: ``share = loss_sum / Σ_r count_r`` (differentiable; backward it on each rank) and
    ``mean`` the global mean, ``Σ_r share_r`` (detached, the same on every rank, for logging).

    loss_sum: a scalar, this rank's summed token losses; count: this rank's token count (int or scalar tensor).
    """
    if isinstance(count, Tensor):
        count = count.to(device=loss_sum.device, dtype=torch.float64).reshape(())
    else:  # a fill, not a copy from the host (which waits for the stream)
        count = torch.full((), float(count), dtype=torch.float64, device=loss_sum.device)
    if shard.world > 1:
        count = count.clone()
        dist.all_reduce(count, group=shard.group)
    share = loss_sum / count.to(loss_sum.dtype)
    mean = share.detach().clone()
    if shard.world > 1:
        dist.all_reduce(mean, group=shard.group)
    return share, mean
