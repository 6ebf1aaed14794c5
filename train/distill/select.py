"""``--keep-attention auto:K``: which attention layers to keep.

After stage 1 every attention layer of the teacher has an aligned R layer. For each one, the teacher is run with
only that layer replaced by its R layer, and the cost of the replacement is the mean per-token
``KL(teacher ‖ teacher with layer l replaced)`` on validation batches. The K layers that cost the most stay
attention; the others become R. Ties go to the lower layer index.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .losses import token_kl

__all__ = ["replacement_costs", "keep_most_costly", "parse_keep_attention"]


def parse_keep_attention(text: str, n_layers: int, n_attention: int) -> int:
    """``"auto:K"`` -> K, with 0 <= K <= n_layers and K below the teacher's attention layers (one is replaced)."""
    kind, sep, value = str(text).partition(":")
    try:
        k = int(value) if kind == "auto" and sep else None
    except ValueError:
        k = None
    if k is None:
        raise ValueError(f"--keep-attention: expected auto:K (K attention layers kept, e.g. auto:2), got {text!r}")
    if not 0 <= k <= n_layers:
        raise ValueError(f"--keep-attention: expected K in 0…{n_layers} (the teacher's n_layers), got {k}")
    if k >= n_attention:  # keeping them all replaces none: nothing to distil
        raise ValueError(f"--keep-attention: expected K below the teacher's {n_attention} attention layers (at least "
                         f"one is replaced), got {k}")
    return k


@torch.no_grad()
def replacement_costs(teacher: nn.Module, mixers: dict[int, nn.Module], batches,
                      reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[int, float]:
    """``{l: mean per-token KL(teacher ‖ teacher with block l's mixer replaced by mixers[l])}`` over ``batches``, a
    list of ``(ids (1 or B, T), cu_seqlens or None)``. The teacher is restored afterwards. ``reduce`` (under
    torchrun: an in-place all-reduce sum) combines the per-layer KL sums and the token count of every rank's
    ``batches`` before the division, so each rank gets the costs of all the ranks' batches together."""
    was_training = teacher.training
    teacher.eval()
    totals = {i: 0.0 for i in mixers}
    tokens = 0
    try:
        for ids, cu in batches:
            ref, _ = teacher(ids, cu_seqlens=cu, output_final_state=False)
            tokens += ids.numel()
            for i, mixer in mixers.items():
                block = teacher.blocks[i]
                original = block.mixer
                block.mixer = mixer
                try:
                    logits, _ = teacher(ids, cu_seqlens=cu, output_final_state=False)
                finally:
                    block.mixer = original
                totals[i] += token_kl(logits, ref).double().sum().item()
    finally:
        teacher.train(was_training)
    if reduce is not None:
        device = next(teacher.parameters()).device
        summed = reduce(torch.tensor([*totals.values(), tokens], dtype=torch.float64, device=device)).tolist()
        totals, tokens = dict(zip(totals, summed[:-1])), summed[-1]
    return {i: total / max(tokens, 1) for i, total in totals.items()}


def keep_most_costly(costs: dict[int, float], k: int) -> list[dict]:
    """The ranking, most costly first: ``[{"layer", "kl", "rank", "kept"}]``, the first ``k`` kept."""
    order = sorted(costs, key=lambda i: (-costs[i], i))
    return [{"layer": i, "kl": costs[i], "rank": r + 1, "kept": r < k} for r, i in enumerate(order)]
