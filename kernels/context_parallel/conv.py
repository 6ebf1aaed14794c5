"""`causal_conv1d_cp`: the causal depthwise conv of one long sequence split across ranks.

A conv of width W reads the W − 1 inputs before each token: the shard's first tokens read the halo, the last
W − 1 inputs before the shard (several ranks back when the shard is shorter than W − 1; the sequence's initial
state before position 0). The halo is exactly the conv state the op takes as ``initial_state``, so each rank
runs the op once on its shard with the halo as its state: the numbers of one rank. With packed documents only
the halo's tokens of the first piece's own document are read; the rest of its state is the document's initial
state (zeros by default), as one rank reads it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..causal_conv import causal_conv1d
from ..varlen import on_device
from .comm import keep_in_graph
from .halo import gather_halo

__all__ = ["causal_conv1d_cp"]


def causal_conv1d_cp(x: Tensor, weight: Tensor, bias: Tensor | None = None, initial_state: Tensor | None = None, *,
                     shard, output_final_state: bool = False, backend: str | None = None) -> tuple[Tensor, Tensor | None]:
    """`hybrid.kernels.causal_conv.causal_conv1d` on this rank's shard of the sequence (`SequenceShard`).

    x ``(B, L, C)`` (``(1, L, C)`` packed); weight ``(C, W)``; bias ``(C,)`` or None. initial_state: the W − 1
    inputs before the whole sequence ``(B, W−1, C)``, or per packed document ``(N, W−1, C)``; the same on every
    rank (its gradient is a per-rank part). output_final_state: the last W − 1 inputs of this shard's row (packed:
    of each local piece), as the op returns them. Returns ``(y, final or None)``.
    """
    shard.check_local("x", x)
    B, L, C = x.shape
    K = weight.shape[1] - 1
    if shard.world == 1 or K == 0:  # no halo: one rank, or a width-1 conv (its state is empty)
        init = None if K == 0 else initial_state
        if init is not None and shard.packed:
            init = initial_state[on_device(shard.piece_docs, initial_state.device)]
        return causal_conv1d(x, weight, bias, init, output_final_state=output_final_state,
                             cu_seqlens=shard.cu_seqlens, backend=backend)
    if not shard.packed:
        before = initial_state if initial_state is not None else x.new_zeros(B, K, C)
        halo, token = gather_halo(x, K, shard, before=before, label="conv halo")  # (B, K, C)
        init = halo
    else:
        halo, token = gather_halo(x, K, shard, label="conv halo")  # (1, min(K, start), C)
        docs = on_device(shard.piece_docs, x.device)
        init = x.new_zeros(len(shard.piece_docs), K, C) if initial_state is None else initial_state[docs].to(x.dtype)
        if shard.continues:  # its document's tokens from the halo, the rest from the document's own state
            m = shard.tokens_before(K)
            first = torch.cat([init[0, m:], halo[0, halo.shape[1] - m:]])  # (K, C)
            init = torch.cat([first[None], init[1:]])  # (n, K, C)
    y, final = causal_conv1d(x, weight, bias, init, output_final_state=output_final_state,
                             cu_seqlens=shard.cu_seqlens, backend=backend)
    return keep_in_graph(y, token), final
