"""The context-parallel forward of the attention mixer "A": this rank's queries over the keys up to a window
(or all of them) back, across the shard's edge.

Positions come from the shard: rotary at each token's global position (per document when packed), CARoPE's
phases as one rank's running sums (each shard's sum from zero, plus the sum of the earlier shards of the same
document: `running_sum_in`). The rotated keys and values before the shard come in as a halo
(`window_attention_cp`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from hybrid.kernels.context_parallel import keep_in_graph, running_sum_in, window_attention_cp
from hybrid.rotary import cos_sin_from_phases


def check_attention_shard(layer) -> None:
    """One-line refusal of the attention options without a context-parallel path."""
    if layer.rotary is not None and layer.rotary.length_dependent:
        raise ValueError(f"rotary.scaling: expected a schedule that does not depend on the sequence length with "
                         f"shard= (each shard would see another length), got {layer.rotary.scaling!r}")


def _carope_phases(layer, x: Tensor, shard) -> Tensor:
    """CARoPE phases ``(B, L, G, P)`` at the shard's tokens: the local running sums plus the carried sum."""
    if shard.packed:
        phases, _ = layer.carope.forward_packed(x, shard.cu_seqlens)  # (1, L, G, P), each piece from zero
    else:
        phases, _ = layer.carope(x)  # (B, L, G, P) from zero
    carried, token = running_sum_in(phases[:, -1], shard, "carope phase carry")  # (B, G, P): the earlier shards
    if not shard.continues:
        return keep_in_graph(phases, token)
    e = shard.first_piece_length
    first = phases[:, :e] + carried[:, None]
    return first if e == phases.shape[1] else torch.cat([first, phases[:, e:]], dim=1)


def attend_shard(layer, x: Tensor, shard) -> Tensor:
    """``layer`` (an `Attention`) on this rank's shard x ``(B, L, d_model)`` → y ``(B, L, d_model)``."""
    q, k, v = layer.project(x)
    cs_q = cs_kv = None
    if layer.carope is not None:
        cos, sin = cos_sin_from_phases(_carope_phases(layer, x, shard))  # (B, L, G, P) each
        rep = layer.n_heads // layer.n_kv_heads
        cs_q, cs_kv = (cos.repeat_interleave(rep, dim=2), sin.repeat_interleave(rep, dim=2)), (cos, sin)
    elif layer.rotary is not None:
        cs_q = cs_kv = layer.rotary.cos_sin_shard(shard, device=x.device)  # (L, P) each
    q, k, v = layer.rotate_qkv(q, k, v, cs_q, cs_kv)
    o = window_attention_cp(q, k, v, layer.window, shard=shard, scale=layer.scale, backend=layer.window_backend)
    return layer._finish(o, cs_q)
