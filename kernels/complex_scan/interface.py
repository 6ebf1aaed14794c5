"""Public entry points of the complex scan: argument checks, backend choice, packed sequences, the step.

    s_t = exp(log_decay_t) · exp(−i·theta_t) · s_{t−1} + x_t,      y_t = s_t

per rotary pair (pair k of x is ``x[..., 2k] + i·x[..., 2k+1]``). This is VO-RoPE with exponential decay
(``o_i = Σ_{j≤i} γ^{i−j} R_{j−i} v_j``) written as a diagonal complex linear RNN.

Packed sequences (``cu_seqlens``) run as one row in which the state restarts at each sequence's first token t₀:
its decay is made exactly 0 (``log_decay = −∞``; every backend forms ``exp(−∞) = 0`` exactly, so
``s_{t₀} = x_{t₀}`` and no finite value before t₀ reaches any later state or gradient), and a given initial
state ``s⁰_n`` is folded into that first input, ``x'_{t₀} = x_{t₀} + a_{t₀} · s⁰_n`` with the true
``a_{t₀} = exp(log_decay_{t₀} − i·theta_{t₀})``, so autograd carries its gradients to ``s⁰_n``, ``log_decay_{t₀}``
and ``theta_{t₀}``. The final state of sequence n is ``y`` at its last token. The reference backend instead
runs each sequence alone (the independent check of this construction).
"""
from __future__ import annotations

import importlib.util
import os

import torch

from ..env import read_env
from ..varlen import PackedOffsets
from . import cpu_scan
from . import ops  # noqa: F401  (registers torch.ops.hybrid.complex_scan and its backward)
from .blocked import default_block_size
from .reference import complex_scan_reference
from . import time_split  # (its rule read at each call: the prewarm asks it as a GPU would)
from .checks import (
    check_block_size,
    check_cu_seqlens,
    check_decay_like,
    check_scan_values,
    check_state,
    check_x,
    normalise_decay_like,
    state_dtype,
)

BACKENDS = ("triton", "cpu", "torch", "reference")
BACKEND_ENV = "HYBRID_SCAN_BACKEND"  # formerly HYBRID_BACKEND (still read, with a FutureWarning)


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@torch.compiler.assume_constant_result
def resolve_backend(backend: str | None, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """``backend`` if given, else ``$HYBRID_SCAN_BACKEND`` (``hybrid.kernels.env``), else "auto": triton for CUDA
    tensors when it imports, unless ``dtype`` (x's) is float64, which the Triton kernels do not compute in; cpu (the
    compiled scan, built on first use) for CPU tensors when a C++ compiler is present; torch otherwise. (A constant
    for torch.compile: decided once, when the graph is traced.)"""
    source = "backend"
    if backend is None:
        backend, source = read_env(BACKEND_ENV, ("auto",) + BACKENDS, "auto", old="HYBRID_BACKEND"), BACKEND_ENV
    if backend == "auto":
        if device.type == "cuda" and triton_available() and dtype != torch.float64:
            return "triton"
        return "cpu" if device.type == "cpu" and cpu_scan.available() else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"{source}: expected one of {BACKENDS} or 'auto', got {backend!r}")
    if backend == "cpu":
        if device.type != "cpu":
            raise ValueError(f"{source}: the 'cpu' backend needs CPU tensors, got tensors on {device}")
        if not cpu_scan.available():
            raise ValueError(f"{source}: 'cpu' was asked for but the compiled CPU scan could not be built "
                             "(no C++ compiler, or the deprecated $HYBRID_CPU_SCAN=0); use 'torch'")
    if backend == "triton":
        if dtype == torch.float64:
            raise ValueError(f"{source}: the 'triton' backend computes in float32 (from float32, bfloat16 or float16 "
                             "inputs), got float64 x; use 'torch' (or 'auto', which picks it)")
        if not triton_available():
            raise ValueError(f"{source}: 'triton' was asked for but the triton package is not installed")
        if device.type != "cuda" and not _interpreting():
            raise ValueError(
                f"{source}: the 'triton' backend needs CUDA tensors, got tensors on {device}; "
                "set TRITON_INTERPRET=1 to run it on the CPU interpreter"
            )
    return backend


def complex_scan(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    theta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    block_size: int | None = None,
    backend: str | None = None,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Complex diagonal linear recurrence over time, differentiable in every input; compiles with
    ``torch.compile(fullgraph=True)`` (the scan is the custom op ``hybrid::complex_scan``, see ``ops.py``).

    Args:
        x: ``(B, T, H, D)`` real (float32, bfloat16, float16; float64 for checks), ``D`` even, pairs interleaved.
            With ``cu_seqlens``: ``(1, total_T, H, D)``, N sequences packed into one row.
        log_decay: ``log γ ≤ 0``, broadcastable to ``(B, T, H, D/2)``: ``(H, D/2)`` static per head-channel
            or ``(B, T, H, D/2)`` data-dependent (selective decay).
        theta: rotation angle per step in radians, broadcastable likewise (static schedule or CARoPE
            phase increments).
        initial_state: ``(B, H, D)`` (``(N, H, D)`` with ``cu_seqlens``: one per sequence) or None (zeros).
        output_final_state: also return the state after the last token (of each sequence); training passes
            False (the default) and builds no decoding state.
        cu_seqlens: None, or ``(N+1,)`` int64 (int32 accepted) offsets on x's device: 0, strictly increasing,
            ``total_T``. Sequence n is ``x[:, cu_seqlens[n]:cu_seqlens[n+1]]``; its state starts from
            ``initial_state[n]`` (or zeros) and nothing crosses an offset: each sequence's outputs and
            gradients are those it has run alone. A ``PackedOffsets`` whose ``row_len`` is known (every multiple
            of it a sequence start: a batch of windows packed by documents) runs as that many rows side by side.
        block_size: block length of the torch backend's blocked scan (default ≈ √T); the Triton and cpu
            kernels tile on their own. (Not the model's ``chunk_size``, the length of its chunked mode.)
        backend: ``"triton"``, ``"cpu"``, ``"torch"`` or ``"reference"``; default ``$HYBRID_SCAN_BACKEND``, else
            triton for CUDA tensors when Triton imports, cpu (compiled on first use) for CPU tensors when a
            C++ compiler is present, else torch (the blocked scan in plain PyTorch, any device).
        check_values: check ``log_decay ≤ 0`` and ``theta`` finite, NaN refused (one device sync for both).
            Models whose decay is ≤ 0 and angles finite by construction pass False (no sync). Skipped while
            torch.compile traces, as are the value checks of ``cu_seqlens``.

    Returns:
        ``(y, final_state)``: ``y`` ``(B, T, H, D)`` in x's dtype (``y_t = s_t``); ``final_state`` None unless
        ``output_final_state``, else ``(B, H, D)`` (``(N, H, D)`` with ``cu_seqlens``) float32 (float64 for
        float64 ``x``).
    """
    check_x(x)
    B, T, H, D = x.shape
    P = D // 2
    target, layout = (B, T, H, P), "(B, T, H, D/2)"
    log_decay = check_decay_like(log_decay, "log_decay", target, layout, x)
    theta = check_decay_like(theta, "theta", target, layout, x)
    if check_values:
        check_scan_values(log_decay, theta, ("log_decay", "theta"))
    if cu_seqlens is None:
        initial_state = check_state(initial_state, "initial_state", (B, H, D), x)
    else:
        rows = cu_seqlens.row_len if isinstance(cu_seqlens, PackedOffsets) else None
        cu_seqlens = check_cu_seqlens(cu_seqlens, x)  # the tensor (a PackedOffsets gives its own: no read back)
        N = cu_seqlens.numel() - 1
        initial_state = check_state(initial_state, "initial_state", (N, H, D), x,
                                    layout="(N, H, D) (one per sequence of cu_seqlens)")
    check_block_size(block_size)
    which = resolve_backend(backend, x.device, x.dtype)
    if cu_seqlens is not None:
        return _packed(x, log_decay, theta, initial_state, cu_seqlens, which, block_size, output_final_state, rows)
    y, final = _scan(x, log_decay, theta, initial_state, which, block_size)
    return y, (final if output_final_state else None)


def _scan(x, log_decay, theta, initial_state, which, block_size):
    """One backend on checked inputs, every row its own sequence: ``(y, final_state)``."""
    B, T, H, D = x.shape
    P = D // 2
    if T == 0:
        final = initial_state if initial_state is not None else x.new_zeros(B, H, D, dtype=state_dtype(x.dtype))
        return x.new_empty(B, 0, H, D), final.clone()
    if which == "reference":
        return complex_scan_reference(x, log_decay, theta, initial_state, output_final_state=True)
    x = x.contiguous()
    log_decay = normalise_decay_like(log_decay, B, T, H, P)  # (Bd, Td, H, P)
    theta = normalise_decay_like(theta, B, T, H, P)

    def op(x, log_decay, theta, initial_state):
        block = 0
        if which == "torch":
            block = block_size if block_size is not None else default_block_size(x.shape[1])
        inputs = (x, log_decay, theta) + ((initial_state,) if initial_state is not None else ())
        save = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        y, final, _, _ = torch.ops.hybrid.complex_scan(x, log_decay, theta, initial_state, which, block, save)
        return y, final

    pieces = time_split.pieces_for(B, T, H, P, x.device, which)
    if pieces > 1:  # few long rows: many short ones, twice (time_split.py)
        return time_split.split_in_time(op, x, log_decay, theta, initial_state, pieces)
    return op(x, log_decay, theta, initial_state)


# ---------------------------------------------------------------------------------------------- packed


def _packed(x, log_decay, theta, initial_state, cu_seqlens, which, block_size, output_final_state, rows=None):
    """N sequences packed into ``x`` ``(1, total_T, H, D)``: ``(y, (N, H, D) final states or None)``. ``rows``:
    every multiple of it is a sequence start (``PackedOffsets.row_len``): the scan then runs ``total_T / rows``
    rows side by side, the same arithmetic (each row starts from a zero state, as the restart there makes it),
    with that many times the parallelism of one row: a GPU kernel walks time one step after another, one
    program per (row, head, block of pairs), so one packed row of a training batch (B windows of L) would give it
    B times fewer programs than the same batch padded."""
    _, T, H, D = x.shape
    P = D // 2
    cu = cu_seqlens.long()
    real = state_dtype(x.dtype)
    log_decay = normalise_decay_like(log_decay, 1, T, H, P)  # (1, Td, H, P)
    theta = normalise_decay_like(theta, 1, T, H, P)
    if which == "reference":
        return complex_scan_reference(x, log_decay, theta, initial_state, output_final_state=output_final_state,
                                      cu_seqlens=cu)
    starts = cu[:-1]
    # the final states are read from y: keep y in the state dtype when they (or a folded state) are needed
    work = x.to(real) if (initial_state is not None or output_final_state) else x
    if initial_state is not None:
        work = work.index_add(1, starts, _carried_in(log_decay, theta, initial_state, starts).unsqueeze(0))
    log_decay = _restarted(log_decay, starts, T)  # (1, T, H, P)
    if rows is not None and rows < T:  # (1, T, ·, ·) -> (T / rows, rows, ·, ·): each row a run of whole sequences
        side = lambda t: t.reshape(T // rows, rows, *t.shape[2:]) if t.shape[1] == T else t  # noqa: E731
        y, _ = _scan(side(work), side(log_decay), side(theta), None, which, block_size)
        y = y.reshape(1, T, H, D)
    else:
        y, _ = _scan(work, log_decay, theta, None, which, block_size)
    final = y[0, cu[1:] - 1] if output_final_state else None  # (N, H, D): y_t = s_t at each last token
    return y.to(x.dtype), final


def _restarted(log_decay: torch.Tensor, starts: torch.Tensor, T: int) -> torch.Tensor:
    """``log_decay`` ``(1, Td, H, P)`` as ``(1, T, H, P)`` with −∞ (γ = 0, no carry-over) at each sequence's
    first token. Differentiable: the gradient at those tokens is 0 here (it flows through ``_carried_in``)."""
    first = torch.zeros(T, dtype=torch.bool, device=log_decay.device).index_fill_(0, starts, True)
    return torch.where(first.view(1, T, 1, 1), float("-inf"), log_decay)  # (1, T, H, P)


def _carried_in(log_decay, theta, initial_state, starts) -> torch.Tensor:
    """``a_{t₀} · s⁰_n`` ``(N, H, D)`` for each sequence's first token t₀, with the true decay
    ``a_{t₀} = exp(log_decay_{t₀} − i·theta_{t₀})``, in real arithmetic (pairs interleaved)."""
    N, H, D = initial_state.shape
    P = D // 2

    def at_starts(t):  # (1, Td, H, P) -> (N, H, P)
        return t[0, starts] if t.shape[1] > 1 else t[0, 0].expand(N, H, P)

    gamma, th = torch.exp(at_starts(log_decay)), at_starts(theta)
    ar, ai = gamma * torch.cos(th), -gamma * torch.sin(th)
    sr, si = initial_state.view(N, H, P, 2).unbind(-1)  # (N, H, D) -> (N, H, P) twice
    return torch.stack((ar * sr - ai * si, ar * si + ai * sr), dim=-1).view(N, H, D)  # (N, H, P, 2) -> (N, H, D)


# ---------------------------------------------------------------------------------------------- the step


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
    if torch.compiler.is_compiling():  # Inductor generates no code for complex tensors: real pairs fuse
        return complex_scan_transition_step(x_t, transition_pairs(log_decay_t, theta_t), state)
    return complex_scan_transition_step(x_t, torch.exp(torch.complex(log_decay_t, -theta_t)), state)


def transition_pairs(log_decay: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """The transition ``a = γ e^{−iθ}`` as real pairs ``(..., 2)``: ``(γ cos θ, −γ sin θ)``, ``γ = exp(log_decay)``."""
    magnitude = torch.exp(log_decay)
    return torch.stack((magnitude * torch.cos(theta), -(magnitude * torch.sin(theta))), dim=-1)


def complex_scan_transition_step(x_t: torch.Tensor, transition: torch.Tensor, state: torch.Tensor | None):
    """``complex_scan_step`` from its transition ``a = γ e^{−iθ}``, unchecked: ``s = a · state + x_t``. A caller
    whose γ and θ are parameters computes ``a`` once for many steps (``hybrid.recurrence``).

    ``a`` complex, broadcastable to ``(B, H, D/2)``: a complex product, the fewest ops eagerly. ``a`` real pairs
    ``(..., D/2, 2)`` (``transition_pairs``): the product written out, ``(a_r s_r − a_i s_i, a_r s_i + a_i s_r)``,
    what a compiled step takes, since Inductor generates no code for complex tensors and fuses this
    (docs/decoding.md, "The compiled step in the graph")."""
    B, H, D = x_t.shape
    x = x_t.to(state_dtype(x_t.dtype))
    if transition.is_complex():
        xc = torch.view_as_complex(x.reshape(B, H, D // 2, 2).contiguous())  # (B, H, P)
        s = xc if state is None else transition * torch.view_as_complex(state.reshape(B, H, D // 2, 2)) + xc
        new_state = torch.view_as_real(s).reshape(B, H, D)
    else:
        pairs = x.reshape(B, H, D // 2, 2)  # (B, H, P, 2)
        if state is not None:
            a_r, a_i = transition.unbind(-1)
            s_r, s_i = state.reshape(B, H, D // 2, 2).unbind(-1)  # (B, H, P) each
            pairs = torch.stack((a_r * s_r - a_i * s_i, a_r * s_i + a_i * s_r), dim=-1) + pairs
        new_state = pairs.reshape(B, H, D)
    return new_state.to(x_t.dtype), new_state
