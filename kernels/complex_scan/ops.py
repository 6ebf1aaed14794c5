"""The scan as ``torch.library`` custom ops, so that ``torch.compile(fullgraph=True)`` traces through it.

    hybrid::complex_scan(x, log_decay, theta, initial_state?, backend, block_size, save_for_backward)
        -> (y, final_state, residual, tile)
    hybrid::complex_scan_backward(grad_y?, grad_final?, x?, log_decay, theta, initial_state?, residual, tile,
                                  x_dtype, backend, block_size, needs)
        -> (grad_x, grad_log_decay, grad_theta, grad_initial_state)

Both take inputs already checked and normalised by ``interface.py`` (shapes and dtypes in ``checks.py``):
``x`` contiguous ``(B, T, H, D)``; ``log_decay`` / ``theta`` contiguous ``(Bd, Td, H, D/2)`` in the state dtype;
``initial_state`` None or ``(B, H, D)``. ``backend`` is ``"cpu"``, ``"torch"`` or ``"triton"`` (the reference is
plain torch and needs no op); ``block_size`` is the torch backend's block length (ignored by the others).

Each op runs one backend's own forward / backward (``cpu_scan.py``, ``blocked.py``, ``triton_scan.py``); each
has a fake (shape-only) implementation for tracing, and the forward's autograd formula calls the backward op,
so a compiled graph holds both. What the backward needs beyond the inputs and ``y``:

- ``residual``: cpu, torch: the states ``(B, T, H, D)`` in the state dtype when ``x`` is in another dtype (else
  ``y`` is the states and ``residual`` is empty); triton: the checkpoints ``(B, H, rows, D)`` float32; empty
  ``(0,)`` when ``save_for_backward`` is False.
- ``tile``: int64 ``(1,)`` on the CPU: the Triton forward's time tile (its checkpoint interval, which its
  autotuner picks at run time), negative when the forward ran in the runs layout (``triton_runs.py``), which
  the backward then follows; 0 for the other backends. (One element, as before the runs layout: a graph that
  inductor cached then still matches the op.)

Ops return tensors, never None: a gradient not asked for (``needs``) comes back empty ``(0,)``. No output is
a view of an input or of another output.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .blocked import torch_backward, torch_forward
from .cpu_scan import cpu_backward, cpu_forward

_Outputs4 = tuple[Tensor, Tensor, Tensor, Tensor]


def _nothing(like: Tensor) -> Tensor:
    return like.new_empty(0)


def _tile(value: int) -> Tensor:
    return torch.full((1,), value, dtype=torch.int64)


def _final_dtype(backend: str, log_decay: Tensor) -> torch.dtype:
    """The Triton kernels keep float32 states; the others the state dtype (float64 for float64 x)."""
    return torch.float32 if backend == "triton" else log_decay.dtype


# ---------------------------------------------------------------------------------------------- forward


@torch.library.custom_op("hybrid::complex_scan", mutates_args=())
def scan_op(x: Tensor, log_decay: Tensor, theta: Tensor, initial_state: Optional[Tensor], backend: str,
            block_size: int, save_for_backward: bool) -> _Outputs4:
    if backend == "cpu":
        states, final = cpu_forward(x, log_decay, theta, initial_state)
        if x.dtype == states.dtype:
            return states, final, _nothing(states), _tile(0)
        return states.to(x.dtype), final, (states if save_for_backward else _nothing(states)), _tile(0)
    if backend == "torch":
        y, final, states = torch_forward(x, log_decay, theta, initial_state, block_size)
        residual = states if (states is not None and save_for_backward) else _nothing(final)
        return y, final, residual, _tile(0)
    if backend == "triton":
        from .triton_scan import triton_forward

        y, final, ck, ck_tile = triton_forward(x, log_decay, theta, initial_state, save_for_backward)
        return y, final, (ck if ck is not None else _nothing(final)), _tile(ck_tile)
    raise ValueError(f"backend: expected 'cpu', 'torch' or 'triton' for the scan op, got {backend!r}")


@scan_op.register_fake
def _scan_op_fake(x, log_decay, theta, initial_state, backend, block_size, save_for_backward):
    B, T, H, D = x.shape
    final = x.new_empty(B, H, D, dtype=_final_dtype(backend, log_decay))
    if not save_for_backward:
        residual = final.new_empty(0)
    elif backend == "triton":
        from .triton_scan import checkpoint_rows

        residual = final.new_empty(B, H, checkpoint_rows(B, T, H, D // 2), D)
    elif x.dtype != log_decay.dtype:
        residual = x.new_empty(B, T, H, D, dtype=log_decay.dtype)
    else:
        residual = final.new_empty(0)
    return x.new_empty(B, T, H, D), final, residual, torch.empty(1, dtype=torch.int64)


def _setup_context(ctx, inputs, output):
    x, log_decay, theta, initial_state, backend, block_size, _ = inputs
    y, _, residual, tile = output
    ctx.mark_non_differentiable(residual, tile)
    ctx.set_materialize_grads(False)
    ctx.backend, ctx.block_size, ctx.x_dtype = backend, block_size, x.dtype
    if backend == "triton":  # recomputes the states from x and the checkpoints
        ctx.save_for_backward(x, log_decay, theta, initial_state, residual, tile)
    else:  # the states: y itself, or the residual when y was rounded to x's dtype
        states = y if x.dtype == log_decay.dtype else residual
        ctx.save_for_backward(None, log_decay, theta, initial_state, states, tile)


def _autograd_backward(ctx, grad_y, grad_final, _grad_residual, _grad_tile):
    x, log_decay, theta, initial_state, residual, tile = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:4]]
    if not any(needs) or (grad_y is None and grad_final is None):
        return None, None, None, None, None, None, None
    grads = torch.ops.hybrid.complex_scan_backward(grad_y, grad_final, x, log_decay, theta, initial_state,
                                                   residual, tile, ctx.x_dtype, ctx.backend, ctx.block_size,
                                                   needs)
    return (*(g if n else None for g, n in zip(grads, needs)), None, None, None)


scan_op.register_autograd(_autograd_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------- backward


@torch.library.custom_op("hybrid::complex_scan_backward", mutates_args=())
def scan_backward_op(grad_y: Optional[Tensor], grad_final: Optional[Tensor], x: Optional[Tensor],
                     log_decay: Tensor, theta: Tensor, initial_state: Optional[Tensor], residual: Tensor,
                     tile: Tensor, x_dtype: torch.dtype, backend: str, block_size: int,
                     needs: list[bool]) -> _Outputs4:
    needs = tuple(needs)
    if backend == "cpu":
        grads = cpu_backward(grad_y, grad_final, log_decay, theta, residual, initial_state, x_dtype, needs)
    elif backend == "torch":
        grads = torch_backward(grad_y, grad_final, log_decay, theta, residual, initial_state, block_size,
                               x_dtype, needs)
    elif backend == "triton":
        from .triton_scan import triton_backward

        grads = triton_backward(x, log_decay, theta, residual, int(tile.item()), grad_y, grad_final, needs)
    else:
        raise ValueError(f"backend: expected 'cpu', 'torch' or 'triton' for the scan op, got {backend!r}")
    return tuple(_nothing(log_decay) if g is None else g for g in grads)


@scan_backward_op.register_fake
def _scan_backward_op_fake(grad_y, grad_final, x, log_decay, theta, initial_state, residual, tile, x_dtype,
                           backend, block_size, needs):
    B, T, H, D = (x if backend == "triton" else residual).shape
    real = _final_dtype(backend, log_decay)
    need_x, need_ld, need_th, need_s0 = needs
    return (log_decay.new_empty(B, T, H, D, dtype=x_dtype) if need_x else _nothing(log_decay),
            log_decay.new_empty(log_decay.shape, dtype=real) if need_ld else _nothing(log_decay),
            theta.new_empty(theta.shape, dtype=real) if need_th else _nothing(log_decay),
            log_decay.new_empty(B, H, D, dtype=real) if (need_s0 and initial_state is not None)
            else _nothing(log_decay))
