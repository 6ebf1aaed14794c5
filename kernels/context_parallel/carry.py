"""The carry of a linear recurrence across shards: one exchange, then an exclusive scan over the ranks.

A linear recurrence ``S_t = a_t ∘ S_{t−1} + b_t`` (the complex scan: a diagonal complex ``a_t``; retention: a
scalar per head; a cumulative phase: ``a_t = 1``) maps the state entering shard j to the state leaving it by an
affine map, ``S ↦ A_j ∘ S + F_j``: ``A_j`` the product of the shard's transitions (zero when a document starts
inside it), ``F_j`` the state the shard leaves when it starts from zero. The state entering shard r is then

    S_in(r) = A_{r−1} ∘ (… (A_1 ∘ F_0 + F_1) …) + F_{r−1},        S_in(0) = 0

(rank 0's own initial state is already in its ``F_0``). `carry_in` gathers every rank's ``(A_j, F_j)`` in one
collective (a few kilobytes) and folds them. Its backward is the gather's (`comm.gather_shards`): each rank's
adjoint of the pair it sent is the sum of what every later rank's fold sent back, so the adjoint carries flow
from the last rank to the first as the states flowed forward.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .comm import gather_shards

__all__ = ["carry_in"]


def carry_in(transition: Tensor, final: Tensor, shard, apply: Callable[[Tensor, Tensor], Tensor],
             label: str = "carry") -> tuple[Tensor | None, Tensor | None]:
    """The state entering this rank's shard.

    Args:
        transition: ``A`` of this shard, real, any shape (the same on every rank); ``apply(A, S)`` maps a state
            through it. Zero (exactly) when a document starts inside the shard.
        final: ``F``, the state this shard leaves when it starts from zero (its own initial states included),
            real, the same shape and dtype on every rank.
        shard: this rank's `SequenceShard`.
    Returns:
        ``(S_in, token)``: ``S_in`` shaped like ``final`` (None on rank 0, where nothing comes in), and the
        gathered tensor, which a rank that does not use ``S_in`` passes to `comm.keep_in_graph` (None on one rank).
    """
    if shard.world == 1:
        return None, None
    if transition.dtype != final.dtype:
        transition = transition.to(final.dtype)
    n_a = transition.numel()
    packed = torch.cat([transition.reshape(-1), final.reshape(-1)])  # (n_a + n_f,): one collective for both
    gathered = gather_shards(packed, shard, label)  # (world, n_a + n_f)
    if shard.rank == 0:
        return None, gathered
    state = None
    for j in range(shard.rank):
        a_j = gathered[j, :n_a].view(transition.shape)
        f_j = gathered[j, n_a:].view(final.shape)
        state = f_j if state is None else apply(a_j, state) + f_j
    return state, gathered


def _scale(a: Tensor, s: Tensor) -> Tensor:
    return a * s


def running_sum_in(final: Tensor, shard, label: str = "sum carry") -> tuple[Tensor | None, Tensor | None]:
    """The carry of a running sum (``S_t = S_{t−1} + b_t``, restarted at each document: a cumulative phase):
    `carry_in` with the transition 1, or 0 when a document starts inside the shard. ``final`` is the sum over this
    shard's last piece; returns ``(S_in or None, token)``, as `carry_in`."""
    transition = final.new_full((1,), 1.0 if shard.passes_through() else 0.0)
    return carry_in(transition, final, shard, _scale, label)
