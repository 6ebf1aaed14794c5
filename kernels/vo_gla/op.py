"""The custom op ``hybrid::vo_gla``: one node for torch.compile (fullgraph), with its backward as a second op.

``forward`` is the whole computation on checked, normalised inputs (public shapes in and out) for the backend
named: "torch" (``chunkwise.py``) or "fla" (``fla.py``). Eager calls run it directly, under plain autograd; a
compiled graph calls it through the op, whose backward (``hybrid::vo_gla_backward``) recomputes it under autograd
and differentiates it (``hybrid.kernels.recompute``): memory O(inputs) between the passes, one extra forward.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..matrix_state import empty_input_result
from ..recompute import recompute_vjp
from ..varlen import PackedOffsets, device_offsets, whole_rows
from .checks import state_dtype
from .chunkwise import vo_gla_chunkwise
from .fla import vo_gla_fla


def forward(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, theta: Tensor, initial_state: Tensor | None,
            cu_seqlens: Tensor | None, tile_size: int, output_final_state: bool, backend: str):
    """log_decay ``(Bd, Td, H)``, theta ``(Bd, Td, H, P)`` (Bd ∈ {1, B}, Td ∈ {1, T}); initial / final states
    ``(N, H, Dk, Dv)`` with cu_seqlens (a tensor, or in eager calls a ``PackedOffsets``, whose host copy lays out
    the chunks), ``(B, H, Dk, Dv)`` without. Returns (o in q's dtype, final or None)."""
    B, T, H, Dk = q.shape
    sdt = state_dtype(q.dtype)
    packed = cu_seqlens is not None
    bounds = cu_seqlens.bounds if isinstance(cu_seqlens, PackedOffsets) else None  # on the host: no read back
    cu_seqlens = None if cu_seqlens is None else device_offsets(cu_seqlens)
    if T == 0:  # nothing to mix: the state passes through
        return empty_input_result(q, v, initial_state, cu_seqlens, output_final_state)
    if backend == "fla":
        return vo_gla_fla(q, k, v, log_decay, theta, initial_state, cu_seqlens, output_final_state, bounds=bounds)
    cu = cu_seqlens.long() if packed else whole_rows(T, q.device)
    init = None
    if initial_state is not None:
        init = initial_state.to(sdt)
        init = init[None] if packed else init[:, None]  # (B, N, H, Dk, Dv)
    g = log_decay.to(sdt).expand(B, T, H)
    th = theta.to(sdt)  # (Bd, Td, H, P): the chunkwise form keeps one angle per pair (Td = 1) unexpanded
    o, final = vo_gla_chunkwise(q.to(sdt), k.to(sdt), v.to(sdt), g, th, init, cu, tile_size, output_final_state,
                                bounds=bounds)
    if final is not None:
        final = final[0] if packed else final[:, 0]
    return o.to(q.dtype), final


@torch.library.custom_op("hybrid::vo_gla", mutates_args=())
def vo_gla_op(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, theta: Tensor, initial_state: Optional[Tensor],
              cu_seqlens: Optional[Tensor], tile_size: int, output_final_state: bool,
              backend: str) -> tuple[Tensor, Tensor]:
    """(o, final); final is an empty ``(0,)`` tensor when not output_final_state (an op returns tensors)."""
    o, final = forward(q, k, v, log_decay, theta, initial_state, cu_seqlens, tile_size, output_final_state, backend)
    final = final.contiguous() if final is not None else q.new_empty(0, dtype=state_dtype(q.dtype))
    return o.contiguous(), final  # contiguous, as the fake promises


@vo_gla_op.register_fake
def _(q, k, v, log_decay, theta, initial_state, cu_seqlens, tile_size, output_final_state, backend):
    B, T, H, Dk = q.shape
    n = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    final_shape = (n, H, Dk, v.shape[-1]) if output_final_state else (0,)
    return q.new_empty(B, T, H, v.shape[-1]), q.new_empty(final_shape, dtype=state_dtype(q.dtype))


@torch.library.custom_op("hybrid::vo_gla_backward", mutates_args=())
def vo_gla_backward_op(grad_o: Tensor, grad_final: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                       log_decay: Tensor, theta: Tensor, initial_state: Optional[Tensor],
                       cu_seqlens: Optional[Tensor], tile_size: int, backend: str,
                       needs_grad: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients w.r.t. q, k, v, log_decay, theta, initial_state (an empty ``(0,)`` for each one not in
    ``needs_grad`` and for a None initial_state): the forward recomputed under autograd and differentiated."""
    want_final = grad_final is not None
    cotangents = (grad_o, grad_final) if want_final else (grad_o,)

    def f(*args):
        o, final = forward(*args, cu_seqlens, tile_size, want_final, backend)
        return (o, final) if want_final else (o,)

    return tuple(recompute_vjp(f, (q, k, v, log_decay, theta, initial_state), needs_grad, cotangents))


@vo_gla_backward_op.register_fake
def _(grad_o, grad_final, q, k, v, log_decay, theta, initial_state, cu_seqlens, tile_size, backend, needs_grad):
    return tuple(x.new_empty(x.shape) if x is not None and need else q.new_empty(0)  # contiguous
                 for x, need in zip((q, k, v, log_decay, theta, initial_state), needs_grad))


def _setup_context(ctx, inputs, output):
    q, k, v, log_decay, theta, initial_state, cu_seqlens, tile_size, output_final_state, backend = inputs
    ctx.save_for_backward(q, k, v, log_decay, theta, initial_state, cu_seqlens)
    ctx.tile_size, ctx.output_final_state, ctx.backend = tile_size, output_final_state, backend


def _backward(ctx, grad_o, grad_final):
    q, k, v, log_decay, theta, initial_state, cu_seqlens = ctx.saved_tensors
    if grad_o is None:
        grad_o = torch.zeros(q.shape[:3] + v.shape[-1:], dtype=q.dtype, device=q.device)
    grad_final = grad_final if ctx.output_final_state else None
    needs = [bool(n) for n in ctx.needs_input_grad[:6]]
    grads = torch.ops.hybrid.vo_gla_backward(grad_o, grad_final, q, k, v, log_decay, theta, initial_state,
                                             cu_seqlens, ctx.tile_size, ctx.backend, needs)
    return tuple(g if need else None for g, need in zip(grads, needs)) + (None,) * 4


vo_gla_op.register_autograd(_backward, setup_context=_setup_context)
