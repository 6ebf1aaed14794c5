"""retention: RetNet's retention with a per-head decay γ_h, three ways of computing it side by side.

    o_n = Σ_{m≤n} γ^{n−m} (q_n · k_m) v_m + γ^{n+1} q_n S,      S' = γ^T S + Σ_m γ^{T−1−m} k_mᵀ v_m

``reference.py`` (the parallel form with its ``(T, T)`` decay matrix: the ground truth, tests run it in
float64), ``chunkwise.py`` (the fast form for whole and packed sequences: the parallel form inside tiles of
``tile_size`` tokens plus the state carried across them, O(T·tile_size) memory; the custom op
``hybrid::retention_chunkwise``, so torch.compile traces it whole) and ``step.py`` (one token, the recurrent
form). The op contract of every kernel folder (fla's names)::

    retention_chunkwise(q, k, v, log_decay, initial_state=None, *, output_final_state=False, cu_seqlens=None,
                        tile_size=DEFAULT_TILE_SIZE) -> (o, final_state or None)
    retention_reference(q, k, v, log_decay, initial_state=None, *, output_final_state=False, cu_seqlens=None)
    retention_step(q, k, v, log_decay, state=None) -> (o_t, S_t)

``q, k`` ``(B, T, H, Dk)`` (rotated; k scaled), ``v`` ``(B, T, H, Dv)``, ``log_decay`` ``(H,)``; states
``(B, H, Dk, Dv)``, or ``(N, H, Dk, Dv)`` per sequence with ``cu_seqlens`` ``(N+1,)`` (a packed
``(1, total_T, …)`` batch; no sequence sees another). States in float32 (float64 for float64 inputs),
outputs in q's dtype. No nn.Modules.
"""
from .chunkwise import DEFAULT_TILE_SIZE, retention_chunkwise
from .reference import retention_reference
from .step import retention_step

__all__ = ["DEFAULT_TILE_SIZE", "retention_chunkwise", "retention_reference", "retention_step"]
