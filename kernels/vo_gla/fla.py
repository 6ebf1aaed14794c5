r"""The fla backend: vo_gla on CUDA through fla's simple GLA kernels (``fla-core``, an optional extra).

    o = R_Φᵀ · simpleGLA(q, k, R_Φ v, log γ),      Φ_t = Σ_{s≤t} θ_s  (per sequence)

fla's ``chunk_simple_gla`` (and, for one token, ``fused_recurrent_simple_gla``) does the gated linear attention;
this adapter only turns the values by the sequence's phase before it and the outputs and final states back
after it. fla's kernels cannot carry a rotation across their chunks, so the phase here is the absolute one per
sequence, summed in float64 and wrapped to [0, 2π) before it is rounded to float32
(``rotation.sequence_phase``): the same float32 angle precision as the chunk-local phase of the torch form. The
initial state is in the frame of the token before the sequence (Φ = 0), as fla expects; a final state comes back
in the frame of the sequence's last token, as every form returns it.

Nothing here runs without CUDA and fla-core; the tests run this adapter on the CPU against a stand-in for fla's
functions (the selection logic and the arithmetic around the call).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from types import SimpleNamespace

import torch
from torch import Tensor

from .rotation import rotate, sequence_phase

MAX_HEAD_DIM = 256  # fla's simple GLA kernels tile Dk and Dv up to this


@functools.lru_cache(maxsize=1)
def fla_ops() -> SimpleNamespace | None:
    """fla's ``chunk_simple_gla`` and ``fused_recurrent_simple_gla``, or None when fla-core does not import."""
    try:
        module = importlib.import_module("fla.ops.simple_gla")
        chunk = module.chunk_simple_gla
        return SimpleNamespace(chunk=chunk, recurrent=module.fused_recurrent_simple_gla,
                               takes_host_offsets=takes_host_offsets(chunk))
    except Exception:  # ImportError, or fla's own import-time failure on a machine without its needs
        return None


def takes_host_offsets(chunk) -> bool:
    """Whether fla's ``chunk_simple_gla`` takes ``cu_seqlens_cpu`` (fla-core 0.6 does): the offsets on the host,
    from which it lays out its chunks instead of reading ``cu_seqlens`` back (a device sync per call)."""
    try:
        return "cu_seqlens_cpu" in inspect.signature(chunk).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def fla_unsupported(device: torch.device, dtype: torch.dtype, Dk: int, Dv: int) -> str | None:
    """Why fla cannot run these inputs (None when it can): CUDA tensors, no float64, head sizes ≤ 256."""
    if device.type != "cuda":
        return f"it needs CUDA tensors, got tensors on {device}"
    if dtype == torch.float64:
        return "it has no float64 kernels"
    if max(Dk, Dv) > MAX_HEAD_DIM:
        return f"it takes head sizes up to {MAX_HEAD_DIM}, got Dk={Dk}, Dv={Dv}"
    return None


def _turn_state(S: Tensor, phase_last: Tensor, inverse: bool) -> Tensor:
    """S ``(N, H, Dk, Dv)`` turned by ``e^{∓iΦ}`` with Φ ``(N, H, P)`` (inverse: e^{−iΦ})."""
    sin = torch.sin(phase_last)[:, :, None]
    return rotate(S, torch.cos(phase_last)[:, :, None], -sin if inverse else sin)


def vo_gla_fla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, th: Tensor, initial_state: Tensor | None,
               cu_seqlens: Tensor | None, output_final_state: bool, ops: SimpleNamespace | None = None,
               bounds: tuple[int, ...] | None = None):
    """q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)``, g ``(Bd, Td, H)``, th ``(Bd, Td, H, P)`` (Bd ∈ {1, B},
    Td ∈ {1, T}), initial_state ``(B or N, H, Dk, Dv)`` or None, T ≥ 1; ``ops`` defaults to ``fla_ops()``;
    ``bounds``: ``cu_seqlens`` on the host (a ``PackedOffsets``'s), handed to an fla that takes them. Returns
    ``(o (B, T, H, Dv) in q's dtype, final (B or N, H, Dk, Dv) float32 or None)``."""
    ops = ops or fla_ops()
    host = {}
    if cu_seqlens is not None and bounds is not None and getattr(ops, "takes_host_offsets", False):
        host = {"cu_seqlens_cpu": torch.tensor(bounds, dtype=cu_seqlens.dtype)}
    B, T, H, _ = q.shape
    phase = sequence_phase(th.float(), T, cu_seqlens)  # (Bd, T, H, P) in [0, 2π)
    cos, sin = torch.cos(phase), torch.sin(phase)
    v_turned = rotate(v.float(), cos, sin).to(v.dtype)  # R_Φ v
    gate = g.float().expand(B, T, H).contiguous()  # fla takes a per-token log decay (B, T, H)
    init = None if initial_state is None else initial_state.float()
    o, final = ops.chunk(q, k, v_turned, g=gate, scale=1.0, initial_state=init,
                         output_final_state=output_final_state, cu_seqlens=cu_seqlens, **host)
    o = rotate(o.float(), cos, -sin).to(q.dtype)  # R_Φᵀ
    if output_final_state:
        if cu_seqlens is not None:  # each sequence's last token, in the one packed row
            ends = cu_seqlens[1:].long() - 1
        else:
            ends = torch.full((B,), T - 1, device=q.device)
        rows = torch.arange(B, device=q.device) if phase.shape[0] == B and cu_seqlens is None else 0 * ends
        final = _turn_state(final.float(), phase[rows, ends], inverse=True)  # (N, H, P): each one's last phase
    return o, (final if output_final_state else None)


def vo_gla_step_fla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, th: Tensor, state: Tensor | None,
                    ops: SimpleNamespace | None = None) -> tuple[Tensor, Tensor]:
    """One token through fla's ``fused_recurrent_simple_gla``: the state turned by ``e^{−iθ}`` here, then the decay,
    the write and the read there. q, k ``(B, H, Dk)``, v ``(B, H, Dv)``, g ``(B, H)``, th ``(B, H, P)``, state
    ``(B, H, Dk, Dv)`` float32 or None. Returns ``(o (B, H, Dv), S (B, H, Dk, Dv) float32)``."""
    ops = ops or fla_ops()
    if state is not None:
        state = rotate(state.float(), torch.cos(th.float())[:, :, None], -torch.sin(th.float())[:, :, None])
    o, S = ops.recurrent(q[:, None], k[:, None], v[:, None], g=g.float()[:, None].contiguous(), scale=1.0,
                         initial_state=state, output_final_state=True)
    return o[:, 0], S.float()
