"""The model's context-parallel forward: one long sequence split across ranks, each rank's logits the rows of
one rank's logits (``HybridLM.forward(ids, shard=…)``).

Every rank holds a contiguous shard of the token ids (``hybrid.kernels.context_parallel.shard_sequence``). The
embedding and the absolute positions are per token (positions from the shard's global offset, per document when
packed); each mixer runs its context-parallel path (``forward(x, shard=…)``: a carry for R, M and G, a halo for the
conv and windowed attention, every earlier shard's keys for global attention); the MLPs and norms are per token.
The loss is the global token mean (``global_token_mean``); the parameters' gradients, summed over the ranks of
the shard's group, are one rank's.

Refused in one line: a mode other than "parallel", a state in or out, ``cu_seqlens`` (the shard holds the packed
offsets), ids that are not the shard's, and a mixer or option without a context-parallel path.
"""
from __future__ import annotations

import torch

from hybrid.abs_pos import packed_positions

__all__ = ["check_shardable", "forward_shard"]


def check_shardable(model) -> None:
    """Raise the one-line refusal of the first mixer (or option) of ``model`` that has no context-parallel path."""
    for block in model.blocks:
        block.mixer.check_shard()


def _check_call(ids: torch.Tensor, shard, mode: str, state, chunk_size, cu_seqlens, output_final_state: bool) -> None:
    if mode != "parallel":
        raise ValueError(f"mode: expected 'parallel' with shard= (context parallelism), got {mode!r}")
    if chunk_size is not None:
        raise ValueError(f"chunk_size: expected None with shard= (the parallel mode), got {chunk_size}")
    if state is not None:
        raise ValueError(f"state: expected None with shard= (each sequence starts fresh), got {type(state).__name__}")
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens: expected None with shard= (the shard holds the packed offsets: "
                         "shard_sequence(total, group, cu_seqlens=…)), got a tensor")
    if output_final_state:
        raise ValueError("output_final_state: expected False with shard= (a context-parallel forward builds no "
                         "decoding state), got True")
    B, L = ids.shape
    if L != shard.length or (shard.packed and B != 1):
        want = f"({'1' if shard.packed else 'B'}, {shard.length})"
        raise ValueError(f"input_ids: expected this rank's shard of shape {want} ({shard}), got {tuple(ids.shape)}")


def forward_shard(model, input_ids: torch.Tensor, shard, *, mode: str = "parallel", state=None, chunk_size=None,
                  cu_seqlens=None, output_final_state: bool = False):
    """``model``'s logits ``(B, L, vocab_size)`` for this rank's shard of the ids, and None (no state)."""
    _check_call(input_ids, shard, mode, state, chunk_size, cu_seqlens, output_final_state)
    check_shardable(model)
    h = model.embed(input_ids)  # (B, L, d_model)
    if model.abs_pos is not None:
        pos = shard.positions(device=h.device)  # (L,): each token's position in its sequence
        h = h + packed_positions(model.abs_pos, pos, shard.total, device=h.device, dtype=h.dtype)
    logits, _ = model._run_blocks(h, [None] * len(model.blocks), 0, None, False, shard)
    return logits, None
