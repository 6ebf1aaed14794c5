"""Public entry points of vo_gla: argument checks, the backend choice, the op and the one-token step."""
from __future__ import annotations

import torch
from torch import Tensor

from ..env import read_env
from ..varlen import device_offsets
from .checks import check_cu_seqlens, check_inputs, check_state, check_tile_size, state_dtype
from .checks import check_values as check_value_ranges
from .fla import fla_ops, fla_unsupported, vo_gla_step_fla
from .op import forward, vo_gla_op
from .reference import vo_gla_reference
from .step import vo_gla_step_torch

BACKENDS = ("fla", "torch", "reference")
BACKEND_ENV = "HYBRID_GLA_BACKEND"
DEFAULT_TILE_SIZE = 64


@torch.compiler.assume_constant_result
def resolve_backend(backend: str | None, device: torch.device, dtype: torch.dtype, Dk: int, Dv: int) -> str:
    """``backend`` if given, else ``$HYBRID_GLA_BACKEND`` (``hybrid.kernels.env``), else "auto": "fla" where fla-core
    imports and can run the inputs (CUDA, not float64, head sizes ≤ 256), else "torch". An explicit "fla" that
    cannot run is a one-line error saying why. (A constant for torch.compile: decided when the graph is traced.)"""
    source = "backend"
    if backend is None:
        backend, source = read_env(BACKEND_ENV, ("auto",) + BACKENDS, "auto"), BACKEND_ENV
    if backend == "auto":
        return "fla" if fla_unsupported(device, dtype, Dk, Dv) is None and fla_ops() is not None else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"{source}: expected one of {BACKENDS} or 'auto', got {backend!r}")
    if backend == "fla":
        if fla_ops() is None:
            raise ValueError(f"{source}: 'fla' was asked for but fla-core does not import (pip install fla-core)")
        why = fla_unsupported(device, dtype, Dk, Dv)
        if why is not None:
            raise ValueError(f"{source}: 'fla' was asked for but {why}")
    return backend


def _pad_dims(t: Tensor, ndim: int) -> Tensor:
    """Leading size-1 axes up to ``ndim`` dimensions (the broadcast shape the op takes)."""
    return t.reshape((1,) * (ndim - t.dim()) + tuple(t.shape))


def vo_gla(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, theta: Tensor, initial_state: Tensor | None = None, *,
           output_final_state: bool = False, cu_seqlens: Tensor | None = None, tile_size: int = DEFAULT_TILE_SIZE,
           backend: str | None = None, check_values: bool = True) -> tuple[Tensor, Tensor | None]:
    """VO-RoPE gated linear attention, differentiable in every input; compiles with ``torch.compile(fullgraph=True)``
    (the op ``hybrid::vo_gla``).

    Args:
        q, k: ``(B, T, H, Dk)`` (no scale is applied: scale q or k before); v: ``(B, T, H, Dv)``, Dv even, pairs
            interleaved. With ``cu_seqlens``: ``(1, total_T, …)``, N sequences packed into one row.
        log_decay: log γ ≤ 0, finite, broadcastable to ``(B, T, H)``: ``(H,)`` static per head or ``(B, T, H)`` per
            token (selective).
        theta: the rotation per step, broadcastable to ``(B, T, H, Dv/2)``: ``(H, Dv/2)`` static (VO-RoPE
            frequencies) or ``(B, T, H, Dv/2)`` per token (data-dependent).
        initial_state: ``(B, H, Dk, Dv)`` (``(N, H, Dk, Dv)`` with cu_seqlens) or None (zeros).
        output_final_state: also return the state after each sequence (training passes False).
        cu_seqlens: None, or ``(N+1,)`` offsets of N sequences packed into one row; every state, decay sum and
            phase restarts at each offset, and nothing crosses one. A ``PackedOffsets`` (``hybrid.kernels.varlen``,
            checked once where the batch entered the model) is taken as it is: its host copy lays out the chunks,
            so the torch form reads nothing back.
        tile_size: the chunk length C of the torch form (any positive int; the numbers do not depend on it).
        backend: "fla" (fla-core's simple GLA on CUDA), "torch" (the chunkwise torch form, any device) or
            "reference" (the O(T²) formula); default ``$HYBRID_GLA_BACKEND``, else fla where it imports and can
            run the inputs, else torch.
        check_values: check ``log_decay`` finite and ≤ 0 and ``theta`` finite (one device sync); models whose
            values are so by construction pass False. Skipped while torch.compile traces.

    Returns:
        ``(o, final_state)``: o ``(B, T, H, Dv)`` in q's dtype; final_state None unless output_final_state, else
        ``(B or N, H, Dk, Dv)`` float32 (float64 for float64 inputs), in the frame of each sequence's last token.
    """
    check_tile_size(tile_size)
    check_inputs(q, k, v, log_decay, theta)
    if check_values:
        check_value_ranges(log_decay, theta)
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    if cu_seqlens is not None:
        N = check_cu_seqlens(cu_seqlens, q)
        check_state(initial_state, "initial_state", (N, H, Dk, Dv), q, "(N, H, Dk, Dv) (one per sequence)")
    else:
        check_state(initial_state, "initial_state", (B, H, Dk, Dv), q)
    which = resolve_backend(backend, q.device, q.dtype, Dk, Dv)
    output_final_state = bool(output_final_state)
    if which == "reference":
        return vo_gla_reference(q, k, v, log_decay, theta, initial_state, output_final_state=output_final_state,
                                cu_seqlens=cu_seqlens)
    sdt = state_dtype(q.dtype)
    log_decay, theta = _pad_dims(log_decay.to(sdt), 3), _pad_dims(theta.to(sdt), 4)  # (Bd, Td, H), (Bd, Td, H, P)
    if not torch.compiler.is_compiling():  # eager: plain autograd through the implementation, no recompute
        return forward(q, k, v, log_decay, theta, initial_state, cu_seqlens, tile_size, output_final_state, which)
    o, final = vo_gla_op(q, k, v, log_decay.contiguous(), theta.contiguous(), initial_state,
                         None if cu_seqlens is None else device_offsets(cu_seqlens), tile_size, output_final_state,
                         which)
    return o, (final if output_final_state else None)


def vo_gla_step(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, theta: Tensor, state: Tensor | None = None, *,
                backend: str | None = None, check_values: bool = True) -> tuple[Tensor, Tensor]:
    """One token: ``S_t = γ_t (S_{t−1} e^{−iθ_t}) + k_t ⊗ v_t``, ``o_t = q_t S_t``.

    q, k ``(B, H, Dk)``, v ``(B, H, Dv)``, log_decay broadcastable to ``(B, H)``, theta to ``(B, H, Dv/2)``, state
    ``(B, H, Dk, Dv)`` or None (zeros). Backends as ``vo_gla`` ("fla": fla's ``fused_recurrent_simple_gla``;
    "reference" is the torch step). Returns ``o_t`` ``(B, H, Dv)`` in q's dtype and ``S_t`` ``(B, H, Dk, Dv)`` float32
    (float64 for float64 inputs)."""
    check_inputs(q, k, v, log_decay, theta, step=True)
    if check_values:
        check_value_ranges(log_decay, theta)
    B, H, Dk = q.shape
    Dv = v.shape[-1]
    check_state(state, "state", (B, H, Dk, Dv), q)
    sdt = state_dtype(q.dtype)
    g = log_decay.to(sdt).expand(B, H)
    th = theta.to(sdt).expand(B, H, Dv // 2)
    S = None if state is None else state.to(sdt)
    if resolve_backend(backend, q.device, q.dtype, Dk, Dv) == "fla":
        o, S = vo_gla_step_fla(q, k, v, g, th, S)
    else:
        o, S = vo_gla_step_torch(q.to(sdt), k.to(sdt), v.to(sdt), g, th, S)
    return o.to(q.dtype), S
