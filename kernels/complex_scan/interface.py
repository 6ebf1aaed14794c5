"""Public entry points of the complex scan: argument checks, backend choice, the one-token step.

    s_t = exp(log_decay_t) · exp(−i·theta_t) · s_{t−1} + x_t,      y_t = s_t

per rotary pair (pair k of x is ``x[..., 2k] + i·x[..., 2k+1]``). This is VO-RoPE with exponential decay
(``o_i = Σ_{j≤i} γ^{i−j} R_{j−i} v_j``) written as a diagonal complex linear RNN.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from . import cpu_scan
from .chunked import complex_scan_torch
from .reference import complex_scan_reference
from .validate import (
    check_chunk_size,
    check_decay_like,
    check_scan_values,
    check_state,
    check_x,
    normalise_decay_like,
    state_dtype,
)

BACKENDS = ("triton", "cpu", "torch", "reference")
BACKEND_ENV = "HYBRID_BACKEND"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """``backend`` if given, else ``$HYBRID_BACKEND``, else: triton for CUDA tensors when it imports; cpu
    (the compiled scan, built on first use) for CPU tensors when a C++ compiler is present; torch otherwise."""
    source = "backend"
    if backend is None and os.environ.get(BACKEND_ENV):
        backend, source = os.environ[BACKEND_ENV], BACKEND_ENV
    if backend is None or backend == "auto":
        if device.type == "cuda" and triton_available():
            return "triton"
        return "cpu" if device.type == "cpu" and cpu_scan.available() else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"{source}: expected one of {BACKENDS} or 'auto', got {backend!r}")
    if backend == "cpu":
        if device.type != "cpu":
            raise ValueError(f"{source}: the 'cpu' backend needs CPU tensors, got tensors on {device}")
        if not cpu_scan.available():
            raise ValueError(f"{source}: 'cpu' was asked for but the compiled CPU scan could not be built "
                             "(no C++ compiler, or ${cpu_scan.DISABLE_ENV}=0); use 'torch'")
    if backend == "triton":
        if not triton_available():
            raise ValueError(f"{source}: 'triton' was asked for but the triton package is not installed")
        if device.type != "cuda" and not _interpreting():
            raise ValueError(
                f"{source}: the 'triton' backend needs CUDA tensors, got tensors on {device}; "
                "set TRITON_INTERPRET=1 to run it on the CPU interpreter"
            )
    return backend


@torch.compiler.disable
def complex_scan(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    theta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    backend: str | None = None,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Complex diagonal linear recurrence over time, differentiable in every input.

    Args:
        x: ``(B, T, H, D)`` real (float32, bfloat16, float16; float64 for checks), ``D`` even, pairs interleaved.
        log_decay: ``log γ ≤ 0``, broadcastable to ``(B, T, H, D/2)``: ``(H, D/2)`` static per head-channel
            or ``(B, T, H, D/2)`` data-dependent (selective decay).
        theta: rotation angle per step in radians, broadcastable likewise (static schedule or CARoPE
            phase increments).
        initial_state: ``(B, H, D)`` float32 or None (zeros).
        chunk_size: chunk length of the torch backend (default ≈ √T); the Triton and cpu kernels tile on
            their own.
        backend: ``"triton"``, ``"cpu"``, ``"torch"`` or ``"reference"``; default ``$HYBRID_BACKEND``, else
            triton for CUDA tensors when Triton imports, cpu (compiled on first use) for CPU tensors when a
            C++ compiler is present, else torch (the blocked scan in plain PyTorch, any device).
        check_values: check ``log_decay ≤ 0`` and ``theta`` finite, NaN refused (one device sync for both).
            Models whose decay is ≤ 0 and angles finite by construction pass False (no sync).

    Returns:
        ``y`` ``(B, T, H, D)`` in x's dtype (``y_t = s_t``) and ``final_state`` ``(B, H, D)`` float32
        (float64 for float64 ``x``).
    """
    check_x(x)
    B, T, H, D = x.shape
    P = D // 2
    target, layout = (B, T, H, P), "(B, T, H, D/2)"
    log_decay = check_decay_like(log_decay, "log_decay", target, layout, x)
    theta = check_decay_like(theta, "theta", target, layout, x)
    if check_values:
        check_scan_values(log_decay, theta, ("log_decay", "theta"))
    initial_state = check_state(initial_state, "initial_state", (B, H, D), x)
    check_chunk_size(chunk_size)
    which = resolve_backend(backend, x.device)

    if T == 0:
        final = initial_state if initial_state is not None else x.new_zeros(B, H, D, dtype=state_dtype(x.dtype))
        return x.new_empty(B, 0, H, D), final.clone()
    if which == "reference":
        return complex_scan_reference(x, log_decay, theta, initial_state)
    x = x.contiguous()
    log_decay = normalise_decay_like(log_decay, B, T, H, P)  # (Bd, Td, H, P)
    theta = normalise_decay_like(theta, B, T, H, P)
    if which == "triton":
        from .triton_scan import complex_scan_triton

        return complex_scan_triton(x, log_decay, theta, initial_state)
    if which == "cpu":
        return cpu_scan.complex_scan_cpu(x, log_decay, theta, initial_state)
    return complex_scan_torch(x, log_decay, theta, initial_state, chunk_size)


def complex_scan_step(
    x_t: torch.Tensor,
    log_decay_t: torch.Tensor,
    theta_t: torch.Tensor,
    state: torch.Tensor | None,
    *,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the scan, for O(1)-memory decoding.

    Args:
        x_t: ``(B, H, D)``.
        log_decay_t, theta_t: broadcastable to ``(B, H, D/2)``.
        state: ``(B, H, D)`` float32, or None (zeros).
        check_values: check ``log_decay_t ≤ 0`` and ``theta_t`` finite (one device sync per call).

    Returns:
        ``y_t`` ``(B, H, D)`` in x_t's dtype and the new state ``(B, H, D)`` float32 (``y_t`` is the state).
    """
    check_x(x_t, "x_t", ndim=3, layout="(B, H, D)")
    B, H, D = x_t.shape
    P = D // 2
    target, layout = (B, H, P), "(B, H, D/2)"
    log_decay_t = check_decay_like(log_decay_t, "log_decay_t", target, layout, x_t)
    theta_t = check_decay_like(theta_t, "theta_t", target, layout, x_t)
    if check_values:
        check_scan_values(log_decay_t, theta_t, ("log_decay_t", "theta_t"))
    state = check_state(state, "state", (B, H, D), x_t)
    real = state_dtype(x_t.dtype)
    xc = torch.view_as_complex(x_t.to(real).reshape(B, H, P, 2).contiguous())  # (B, H, P) complex
    a = torch.exp(torch.complex(log_decay_t, -theta_t))
    s = xc if state is None else a * torch.view_as_complex(state.reshape(B, H, P, 2)) + xc
    new_state = torch.view_as_real(s).reshape(B, H, D)
    return new_state.to(x_t.dtype), new_state
