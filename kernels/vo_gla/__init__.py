r"""vo_gla: VO-RoPE around gated linear attention with a scalar decay per head, the op of the "G" mixer.

    o_i = Σ_{j≤i} (Π_{j<t≤i} γ_t) (q_i · k_j) R_{j−i} v_j = R_Φᵀ · simpleGLA(q, k, R_Φ v, γ),   Φ_t = Σ_{s≤t} θ_s
    S_t = γ_t · (S_{t−1} turned by e^{−iθ_t} on the value pairs) + k_t ⊗ v_t,      o_t = q_t S_t

A ``Dk × Dv`` state per head, addressed by keys, with the seed's relative rotation on the value side (pair p of
v is ``v[2p] + i·v[2p+1]``). With θ = 0 it is simple GLA; with Dk = 1 and q ≡ k ≡ 1 it is ``complex_scan``.

Ways of computing it, side by side: ``reference.py`` (the formula, O(T²), the ground truth; tests run it in
float64), ``chunkwise.py`` (the torch chunkwise form, chunk-local phases), ``step.py`` (one token),
``fla.py`` (fla-core's ``chunk_simple_gla`` / ``fused_recurrent_simple_gla`` on CUDA, an optional extra).
``op.py`` registers the custom op ``hybrid::vo_gla`` (torch.compile traces it whole); ``interface.py`` checks the
arguments and picks a backend. The op contract of every kernel folder (fla's names)::

    vo_gla(q, k, v, log_decay, theta, initial_state=None, *, output_final_state=False, cu_seqlens=None,
           tile_size=64, backend=None) -> (o, final_state or None)
    vo_gla_reference(q, k, v, log_decay, theta, initial_state=None, *, output_final_state=False, cu_seqlens=None)
    vo_gla_step(q, k, v, log_decay, theta, state=None) -> (o_t, S_t)

``q, k`` ``(B, T, H, Dk)``, ``v`` ``(B, T, H, Dv)``, ``log_decay`` ``(H,)`` or ``(B, T, H)``, ``theta`` ``(H, Dv/2)``
or ``(B, T, H, Dv/2)``; states ``(B, H, Dk, Dv)``, or ``(N, H, Dk, Dv)`` per sequence with ``cu_seqlens``, in the
frame of the last token seen (so a state holds no position). States in float32 (float64 for float64 inputs),
outputs in q's dtype. No nn.Modules.
"""
from .fla import fla_ops, fla_unsupported
from .interface import BACKEND_ENV, BACKENDS, DEFAULT_TILE_SIZE, resolve_backend, vo_gla, vo_gla_step
from .reference import vo_gla_reference

__all__ = ["BACKENDS", "BACKEND_ENV", "DEFAULT_TILE_SIZE", "fla_ops", "fla_unsupported", "resolve_backend",
           "vo_gla", "vo_gla_reference", "vo_gla_step"]
