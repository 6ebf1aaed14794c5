"""Packed sequences in attention (flash-attn's varlen convention): per-token sequence ids and positions.

The offsets are checked by the shared `hybrid.kernels.varlen.check_cu_seqlens`. Queries are packed by
`cu_seqlens` and keys by `cu_seqlens_k`; sequence n has `Lq_n` queries and `Lk_n ≥ Lq_n` keys, its queries
being its LAST `Lq_n` keys (bottom-right aligned: the first `P_n = Lk_n − Lq_n` keys are a carried prefix).
Query i of sequence n sits at key position `P_n + i` within its sequence; it sees key position j of the same
sequence iff `j ≤ P_n + i` (and `j > P_n + i − w` with a window), never a key of another sequence.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..varlen import sequence_ids


def query_key_positions(cu_q: Tensor, cu_k: Tensor, n_queries: int, n_keys: int):
    """Per-token sequence ids and positions, in key coordinates within each sequence.

    Returns `seq_q (Tq,)`, `pos_q (Tq,)` (query i of sequence n: `P_n + i`), `seq_k (Tk,)`, `pos_k (Tk,)`
    (key j of sequence n: `j − cu_k[n]`), all long.
    """
    cu_q, cu_k = cu_q.long(), cu_k.long()
    seq_q, seq_k = sequence_ids(cu_q, n_queries), sequence_ids(cu_k, n_keys)
    t = torch.arange(n_queries, device=cu_q.device)
    pos_q = t + (cu_k[1:] - cu_q[1:] - cu_k[:-1])[seq_q]  # t − cu_q[n] + P_n
    pos_k = torch.arange(n_keys, device=cu_k.device) - cu_k[seq_k]
    return seq_q, pos_q, seq_k, pos_k
