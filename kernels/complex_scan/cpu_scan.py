"""The "cpu" backend: the compiled sequential scan of ``cpu_scan.cpp``, forward and backward.

Each row (a batch element and a block of 8–256 consecutive pairs of the flattened heads × pairs, so that a
step reads one contiguous run) runs through time on one thread, vectorised over its pairs; rows are handed
out to ``torch.get_num_threads()`` threads one at a time. One call is one parallel region, so a
second process on the machine delays a row, never a barrier per step (the blocked torch backend has a few
thousand small parallel ops per call, each waiting on every thread). The decay ``a_t = γ_t e^{−iθ_t}`` is
formed inside the loop from ``log_decay`` and ``theta`` in their own (possibly broadcast) shapes, so a
data-dependent decay costs one read of each and no intermediate tensors.

    forward:   s_t = a_t s_{t−1} + x_t
    backward:  λ_t = dy_t + conj(a_{t+1}) λ_{t+1},  ∂x_t = λ_t,  ∂log γ_t + i ∂θ_t = conj(λ_t) a_t s_{t−1},
               ∂s_0 = conj(a_0) λ_0

States are float32 (float64 for float64 ``x``); half-precision ``x`` is converted on the way in and out.
``cpu_forward`` / ``cpu_backward`` are what the custom op of ``ops.py`` runs; ``CpuComplexScan`` wraps the same two
for direct callers. ``log γ = −∞`` gives ``a_t = 0`` exactly (the packed-sequence restart of ``interface.py``).
"""
from __future__ import annotations

import ctypes

import torch

from ..env import read_deprecated
from .cpu_build import load


def available() -> bool:
    """Whether the compiled CPU scan can be used (builds it on the first call). The deprecated
    ``$HYBRID_CPU_SCAN=0`` turns it off (``$HYBRID_SCAN_BACKEND=torch`` now; ``hybrid.kernels.env``)."""
    if read_deprecated("HYBRID_CPU_SCAN", "$HYBRID_SCAN_BACKEND=torch") == "0":
        return False
    return load() is not None


def empty_buffer(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Every buffer the backend writes comes from here, so tests can poison them (fill with NaN). A large one is
    advised onto transparent huge pages first (``advise_huge_pages`` in ``cpu_scan.cpp``): the first write to a
    fresh buffer otherwise costs one page fault per 4 KiB, which for the scan's outputs took longer than the
    scan itself."""
    buf = torch.empty(*shape, dtype=dtype)
    load().advise_huge_pages(buf.data_ptr(), buf.nbytes)
    return buf


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


class _Decay:
    """``log_decay`` and ``theta`` (contiguous, ``(Bd, Td, H, P)`` each) and their batch / time strides in
    elements, 0 where broadcast, as the kernel's ``int64[4]``; the kernel forms ``a_t`` from them itself."""

    def __init__(self, log_decay: torch.Tensor, theta: torch.Tensor):
        self.log_decay, self.theta = log_decay.contiguous(), theta.contiguous()

        def strides(t):
            return [t.stride(0) if t.shape[0] > 1 else 0, t.stride(1) if t.shape[1] > 1 else 0]

        self.strides = (ctypes.c_int64 * 4)(*strides(self.log_decay), *strides(self.theta))
        self.varies_in_time = log_decay.shape[1] > 1 or theta.shape[1] > 1

    def args(self):
        return self.log_decay.data_ptr(), self.theta.data_ptr(), self.strides


# Below this many pairs × steps one thread does the whole scan (starting threads costs more than it saves).
_MIN_THREADED_WORK = 1 << 16
_MAX_BLOCK = 256  # pairs per row: the kernel's kPairs


def _launch(B: int, T: int, H: int, P: int) -> tuple[int, int, int, int, int]:
    """The kernel's (B, T, H, P, block, threads): heads and pairs flattened into one axis of H·P pairs
    (contiguous in every tensor), cut into rows of a multiple of 8 pairs (whole cache lines), as long as
    possible (each thread then streams through long contiguous runs, which the hardware prefetcher follows:
    2.5× faster than 64-pair rows at B4·T4096·H8·D64) while leaving every thread at least one row."""
    threads = torch.get_num_threads() if B * T * H * P >= _MIN_THREADED_WORK else 1
    block = max(8, min(_MAX_BLOCK, (B * H * P) // threads // 8 * 8))
    return B, T, 1, H * P, block, threads


def _entry(kind: str, dtype: torch.dtype):
    return getattr(load(), f"scan_{kind}_{'f64' if dtype == torch.float64 else 'f32'}")


def cpu_forward(x, log_decay, theta, initial_state):
    """Returns the states ``(B, T, H, D)`` and the final state ``(B, H, D)``, both in the state dtype."""
    B, T, H, D = x.shape
    real = log_decay.dtype
    xr = x.to(real).contiguous()
    decay = _Decay(log_decay, theta)
    y = empty_buffer(B, T, H, D, dtype=real)
    final = empty_buffer(B, H, D, dtype=real)
    _entry("forward", real)(xr.data_ptr(), *decay.args(), _ptr(initial_state), y.data_ptr(), final.data_ptr(),
                            *_launch(B, T, H, D // 2))
    return y, final


def _reduce_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum ``g`` ``(B, Tg, H, P)`` over the batch / time axes that ``shape`` broadcasts."""
    dims = tuple(d for d in (0, 1) if shape[d] == 1 and g.shape[d] != 1)
    return g.sum(dims, keepdim=True) if dims else g


def cpu_backward(grad_y, grad_final, log_decay, theta, states, initial_state, x_dtype, needs):
    """Gradients ``(dx, dlog_decay, dtheta, dinitial_state)`` (None where ``needs`` is False) from the upstream
    gradients (either may be None), the normalised inputs and the forward's ``states`` ``(B, T, H, D)`` in the
    state dtype. ``dlog_decay`` / ``dtheta`` come in the shapes of ``log_decay`` / ``theta``; none aliases
    another (the kernel writes them to separate buffers)."""
    need_x, need_ld, need_th, need_s0 = needs
    need_s0 = need_s0 and initial_state is not None
    if grad_y is None and grad_final is None:
        return None, None, None, None
    B, T, H, D = states.shape
    P = D // 2
    real = states.dtype
    decay = _Decay(log_decay, theta)
    Tz = T if decay.varies_in_time else 1
    dy = None if grad_y is None else grad_y.to(real).contiguous()
    dfinal = None if grad_final is None else grad_final.to(real).contiguous()
    dx = empty_buffer(B, T, H, D, dtype=real) if need_x else None
    gld = empty_buffer(B, Tz, H, P, dtype=real) if need_ld else None  # (B, Tz, H, P)
    gth = empty_buffer(B, Tz, H, P, dtype=real) if need_th else None
    ds0 = empty_buffer(B, H, D, dtype=real) if need_s0 else None
    _entry("backward", real)(*decay.args(), states.data_ptr(), _ptr(initial_state), _ptr(dy), _ptr(dfinal),
                             _ptr(dx), _ptr(gld), _ptr(gth), H * P if Tz > 1 else 0, _ptr(ds0),
                             *_launch(B, T, H, P))
    grad_x = None if dx is None else dx.to(x_dtype)
    grad_ld = _reduce_to(gld, log_decay.shape) if need_ld else None
    grad_th = _reduce_to(gth, theta.shape) if need_th else None
    return grad_x, grad_ld, grad_th, ds0


class CpuComplexScan(torch.autograd.Function):
    """Autograd wrapper of the compiled scan; inputs normalised as in ``checks.py``. (The public
    ``complex_scan`` goes through the ``hybrid::complex_scan`` custom op of ``ops.py`` instead, which calls the
    same two functions.)"""

    @staticmethod
    def forward(ctx, x, log_decay, theta, initial_state):
        y, final = cpu_forward(x, log_decay, theta, initial_state)
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(log_decay, theta, y, initial_state)
        ctx.set_materialize_grads(False)
        return (y if x.dtype == y.dtype else y.to(x.dtype)), final

    @staticmethod
    def backward(ctx, grad_y, grad_final):
        log_decay, theta, y, initial_state = ctx.saved_tensors
        return cpu_backward(grad_y, grad_final, log_decay, theta, y, initial_state, ctx.x_dtype,
                            ctx.needs_input_grad[:4])


def complex_scan_cpu(x, log_decay, theta, initial_state):
    """Compiled-scan backend on normalised CPU inputs; returns ``(y, final_state)``."""
    tensors = (x, log_decay, theta) + ((initial_state,) if initial_state is not None else ())
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return CpuComplexScan.apply(x, log_decay, theta, initial_state)
    y, final = cpu_forward(x, log_decay, theta, initial_state)
    return (y if x.dtype == y.dtype else y.to(x.dtype)), final
