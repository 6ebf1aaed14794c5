"""`window_attention_cp`: causal attention (windowed or global) of one long sequence split across ranks.

A query sees the keys up to w − 1 positions back (all of them for global attention). Each rank brings in, as a
halo, the rotated keys and values of the w − 1 tokens before its shard (`halo.gather_halo`: several ranks back
when the window is longer than a shard; every earlier shard for global attention, O(T) memory per rank) and
attends its own queries over ``[halo; own keys]``, bottom-right aligned: the
op's carried-prefix convention (``hybrid.kernels.window_attention``), so the numbers are one rank's. With packed
documents only the halo's tokens of the first piece's document are keys, and only for that piece
(``cu_seqlens_k``).

Keys and values travel together (one collective: the backward's order is then the same on every rank).
Torch's ring attention (``torch.distributed.tensor.experimental.context_parallel``) is not used: it takes over
the CUDA SDPA kernels only (not the CPU's, nor a document mask or a window), and this op must run everywhere.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..window_attention import window_attention
from .comm import keep_in_graph
from .halo import gather_halo

__all__ = ["window_attention_cp"]


def window_attention_cp(q: Tensor, k: Tensor, v: Tensor | None, window: int | None, *, shard, scale: float | None = None,
                        backend: str | None = None) -> Tensor:
    """`hybrid.kernels.window_attention.window_attention` on this rank's shard (`SequenceShard`).

    q ``(B, L, H, D)``, k ``(B, L, G, D)`` (rotated at their global positions), v likewise or None (shared-KV:
    the keys are the values); ``(1, L, …)`` with packed documents. window: w, or None for global attention.
    Returns ``(B, L, H, D)``: this shard's rows of one rank's output.
    """
    shard.check_local("q", q)
    shared = v is None
    size = None if window is None else window - 1
    if shard.world == 1 or size == 0:
        return window_attention(q, k, k if shared else v, window, scale=scale, backend=backend,
                                cu_seqlens=shard.cu_seqlens)
    D = k.shape[-1]
    kv = k if shared else torch.cat([k, v], dim=-1)  # (B, L, G, D or 2D): one exchange for both
    halo, token = gather_halo(kv, size, shard, label="attention halo")  # (B, h, G, ·)
    m = halo.shape[1] if not shard.packed else shard.tokens_before(halo.shape[1])
    cu, cu_k = shard.cu_seqlens, None
    keys, values = k, v
    if m > 0:
        halo = halo[:, halo.shape[1] - m:]  # (B, m, G, ·): the first piece's document only
        keys = torch.cat([halo[..., :D], k], dim=1)  # (B, m + L, G, D)
        values = None if shared else torch.cat([halo[..., D:], v], dim=1)
        if cu is not None:
            cu_k = torch.cat([cu[:1], cu[1:] + m])  # the first piece has m more keys than queries
    o = window_attention(q, keys, keys if shared else values, window, scale=scale, backend=backend,
                         cu_seqlens=cu, cu_seqlens_k=cu_k)
    return keep_in_graph(o, token)
