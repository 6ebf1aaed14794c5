"""retention: RetNet's retention with a per-head decay γ_h, three ways of computing it side by side.

    o_n = Σ_{m≤n} γ^{n−m} (q_n · k_m) v_m + γ^{n+1} q_n S,      S' = γ^T S + Σ_m γ^{T−1−m} k_mᵀ v_m

``reference.py`` (the parallel form with its ``(T, T)`` decay matrix: the ground truth, tests run it in
float64), ``chunkwise.py`` (the fast form for whole sequences: the parallel form inside tiles of
``retention_chunk`` tokens plus the state carried across them, O(T·retention_chunk) memory) and
``step.py`` (one token, the recurrent form). All take ``q, k`` ``(B, T, H, Dk)`` (rotated; k scaled),
``v`` ``(B, T, H, Dv)``, ``log_gamma`` ``(H,)`` and an optional state ``S`` ``(B, H, Dk, Dv)``. No nn.Modules.
"""
from .chunkwise import DEFAULT_RETENTION_CHUNK, retention_chunkwise
from .reference import retention_reference
from .step import retention_step

__all__ = ["DEFAULT_RETENTION_CHUNK", "retention_chunkwise", "retention_reference", "retention_step"]
