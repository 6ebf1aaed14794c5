"""Public entry point of sliding-window attention: argument checks and the choice of the way to compute it.

    o_i = Σ_{p_i − w < j ≤ p_i} softmax_j(scale · q_iᵀ k_j) v_j,      p_i = S − T + i

Ways, all exact (the same numbers to the rounding of the dtype):
    "flash"      flash-attn's window (CUDA, fp16/bf16, when flash-attn is installed)
    "flex"       FlexAttention with a sliding-window block mask (compiled on CUDA; eager elsewhere)
    "blocked"    block-local SDPA, O(T·w) on any device
    "reference"  dense mask, O(T·S): tests only
"auto" (the default) takes the first of flash, flex (head dim a power of two, 16 … 256), blocked that the
tensors allow on CUDA, and blocked elsewhere (eager FlexAttention off CUDA is dense, so it is never chosen
automatically).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from .blocked import window_attention_blocked
from .flash import flash_supports, window_attention_flash
from .flex import FLEX_AVAILABLE, window_attention_flex
from .reference import window_attention_reference

BACKENDS = ("flash", "flex", "blocked", "reference")
BACKEND_ENV = "HYBRID_WINDOW_BACKEND"
# head dims FlexAttention's CUDA kernel handles in every torch release it ships in; others take "blocked"
_FLEX_HEAD_DIMS = (16, 32, 64, 128, 256)
_FORMS = {"flash": window_attention_flash, "flex": window_attention_flex, "blocked": window_attention_blocked,
          "reference": window_attention_reference}


def resolve_window_backend(backend: str | None, q: Tensor) -> str:
    """`backend` if given, else `$HYBRID_WINDOW_BACKEND`, else the fastest exact way for q's device/dtype."""
    source = "backend"
    if backend is None and os.environ.get(BACKEND_ENV):
        backend, source = os.environ[BACKEND_ENV], BACKEND_ENV
    if backend is None or backend == "auto":
        if q.is_cuda and flash_supports(q):
            return "flash"
        if q.is_cuda and FLEX_AVAILABLE and q.shape[-1] in _FLEX_HEAD_DIMS:
            return "flex"
        return "blocked"
    if backend not in BACKENDS:
        raise ValueError(f"{source}: expected one of {BACKENDS} or 'auto', got {backend!r}")
    if backend == "flash" and not flash_supports(q):
        raise ValueError(f"{source}: 'flash' needs flash-attn installed and fp16/bf16 CUDA tensors, "
                         f"got {q.dtype} on {q.device}")
    if backend == "flex" and not FLEX_AVAILABLE:
        raise ValueError(f"{source}: 'flex' needs torch ≥ 2.5 (FlexAttention), got torch {torch.__version__}")
    return backend


def _check(q: Tensor, k: Tensor, v: Tensor, window) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: expected a positive int, got {window!r}")
    if q.dim() != 4:
        raise ValueError(f"q: expected shape (B, T, H, D), got {tuple(q.shape)}")
    B, T, H, D = q.shape
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4 or t.shape[0] != B or t.shape[1] < T or t.shape[3] != D or H % max(t.shape[2], 1):
            raise ValueError(f"{name}: expected shape (B={B}, S ≥ T={T}, G dividing H={H}, D={D}), "
                             f"got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")


def window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, scale: float | None = None,
                     backend: str | None = None) -> Tensor:
    """Causal sliding-window attention, differentiable in q, k, v.

    Args:
        q: `(B, T, H, D)` queries.
        k, v: `(B, S, G, D)`, S ≥ T, in position order; the last T are the queries' own tokens, the first
            S − T the tokens before them (a carried cache: only the last w − 1 of them can be seen). G divides
            H; query head h reads kv head `h // (H/G)`, never materialised where the kernel broadcasts.
        window: w ≥ 1; query i sees keys `p_i − w < j ≤ p_i`, itself included.
        scale: softmax scale, default `D^−1/2`.
        backend: "auto" (default; or `$HYBRID_WINDOW_BACKEND`), "flash", "flex", "blocked", "reference".
    Returns:
        `(B, T, H, D)` in q's dtype.
    """
    _check(q, k, v, window)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if q.shape[1] == 0:
        return q.new_zeros(q.shape)
    return _FORMS[resolve_window_backend(backend, q)](q, k, v, window, scale)
