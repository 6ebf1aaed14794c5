"""Public entry point of the causal depthwise conv: argument checks and the choice of the way to compute it.

    y[t, c] = bias[c] + Σ_{k<W} weight[c, k] · u[t + k, c],    u = [tail; x]   (tail: the last W−1 inputs)

so `weight[:, W−1]` multiplies the current input (the layout of `causal_conv1d`, weights interchangeable).
The state is the tail `(B, W−1, C)` (zeros at stream start), in x's dtype: it holds raw inputs, so carrying it
is lossless, and a call on a then a call on b with a's final state equals one call on a ++ b.

Ways ("backend"):
    "causal_conv1d"  the `causal_conv1d` package's kernels (`fused.py`; CUDA, 2 ≤ W ≤ 4, C % 8 == 0,
                     float32 / float16 / bfloat16, when the package imports)
    "torch"          `F.conv1d(groups=C)` over `[tail; x]` (`depthwise.py`), any device and dtype
    "reference"      an explicit loop over time (`reference.py`): tests only
None takes `$HYBRID_CONV_BACKEND` (`hybrid.kernels.env`), else "auto": "causal_conv1d" where it fits, else "torch"
(`select_conv_backend`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..env import read_env
from ..varlen import check_cu_seqlens
from .checks import check_input, check_state, check_weight_bias
from .depthwise import causal_conv1d_torch
from .fused import causal_conv1d_fused, causal_conv1d_importable, shape_and_dtypes_fit
from .reference import causal_conv1d_reference

BACKENDS = ("causal_conv1d", "torch", "reference")
BACKEND_ENV = "HYBRID_CONV_BACKEND"
_FORMS = {"causal_conv1d": causal_conv1d_fused, "torch": causal_conv1d_torch, "reference": causal_conv1d_reference}


def select_conv_backend(device, channels: int, width: int, *dtypes: torch.dtype) -> str:
    """The backend when the call names none: `$HYBRID_CONV_BACKEND` when set to one of `BACKENDS`, else (for
    "auto") 'causal_conv1d' when the device is CUDA, the shape and dtypes (of x and weight) suit the kernel and
    the package imports, and 'torch' otherwise."""
    choice = read_env(BACKEND_ENV, ("auto",) + BACKENDS, "auto")
    if choice != "auto":
        return _checked(choice, BACKEND_ENV)
    if torch.device(device).type != "cuda" or not shape_and_dtypes_fit(channels, width, *dtypes):
        return "torch"
    return "causal_conv1d" if causal_conv1d_importable() else "torch"


def resolve_conv_backend(backend: str | None, x: Tensor, weight: Tensor) -> str:
    """`backend` as asked ("causal_conv1d" only needs the package to import: its kernels check the rest), or
    `select_conv_backend`'s choice for None / "auto"."""
    if backend is None or backend == "auto":
        return select_conv_backend(x.device, x.shape[-1], weight.shape[1], x.dtype, weight.dtype)
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} or 'auto', got {backend!r}")
    return _checked(backend, "backend")


def _checked(backend: str, source: str) -> str:
    if backend == "causal_conv1d" and not causal_conv1d_importable():
        raise ValueError(f"{source}: 'causal_conv1d' needs the causal_conv1d package (pip install "
                         "'causal-conv1d>=1.4'), which does not import here")
    return backend


def causal_conv1d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, initial_state: Tensor | None = None, *,
    output_final_state: bool = False, cu_seqlens: Tensor | None = None, backend: str | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Causal depthwise conv1d, differentiable in x, weight, bias and initial_state.

    Args:
        x: `(B, T, C)`; `(1, total_T, C)` with `cu_seqlens`.
        weight: `(C, W)`, `weight[:, W−1]` multiplying the current input. bias: `(C,)` or None.
        initial_state: the W−1 inputs before x, `(B, W−1, C)`, or per packed sequence `(N, W−1, C)`;
            None: zeros (stream start).
        output_final_state: return the last W−1 inputs of each row / sequence (including entries of its
            initial state when it is shorter than W−1); training passes False.
        cu_seqlens: `(N+1,)` offsets of N sequences packed into x (`hybrid.kernels.varlen`), or a
            `PackedOffsets` checked already; no tap crosses a sequence boundary.
        backend: None / "auto", "causal_conv1d", "torch", "reference" (module docstring).
    Returns:
        y `(B, T, C)` in x's dtype (computed in the promoted dtype of x and weight), and the final state
        `(B | N, W−1, C)` in x's dtype, or None.
    """
    check_input(x)
    check_weight_bias(weight, bias, x.shape[2])
    rows = x.shape[0]
    if cu_seqlens is not None:  # a PackedOffsets, checked once already, gives its tensor without a read back
        cu_seqlens = check_cu_seqlens(cu_seqlens, x.shape[1], x.device, "cu_seqlens", batch=x.shape[0])
        rows = cu_seqlens.numel() - 1
    check_state("initial_state", initial_state, rows, weight, "N" if cu_seqlens is not None else "B")
    if x.shape[1] == 0:
        final = x.new_zeros(rows, weight.shape[1] - 1, x.shape[2]) if initial_state is None else initial_state
        return x.new_zeros(x.shape), (final.to(x.dtype) if output_final_state else None)
    form = _FORMS[resolve_conv_backend(backend, x, weight)]
    return form(x, weight, bias, initial_state, output_final_state=bool(output_final_state), cu_seqlens=cu_seqlens)
