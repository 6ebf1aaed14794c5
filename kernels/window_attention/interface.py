"""Public entry point of causal attention, windowed or global: argument checks and the choice of the way.

    o_i = Σ_{p_i − w < j ≤ p_i} softmax_j(scale · q_iᵀ k_j) v_j,      p_i = S − T + i     (w None: j ≤ p_i)

Ways, all exact (the same numbers to the rounding of the dtype), all with `window=None` and packed sequences:
    "flash"      flash-attn (`flash_attn_func` / `flash_attn_varlen_func`; CUDA, fp16/bf16, when installed)
    "flex"       FlexAttention with a (document) block mask (compiled on CUDA; eager elsewhere)
    "blocked"    block-local SDPA, O(T·w) on any device (global: SDPA, or the band of the longest sequence)
    "reference"  dense mask, O(T·S): tests only
"auto" (the default) takes the first of flash, flex (head dim a power of two, 16 … 256), blocked that the
tensors allow on CUDA, and blocked elsewhere (eager FlexAttention off CUDA is dense, so it is never chosen
automatically).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..env import read_env
from .blocked import window_attention_blocked
from .checks import check_attention, check_packing
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
    """`backend` if given, else `$HYBRID_WINDOW_BACKEND` (`hybrid.kernels.env`), else "auto": the fastest exact
    way for q's device/dtype."""
    source = "backend"
    if backend is None:
        backend, source = read_env(BACKEND_ENV, ("auto",) + BACKENDS, "auto"), BACKEND_ENV
    if backend == "auto":
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


def window_attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, *, scale: float | None = None,
                     backend: str | None = None, cu_seqlens: Tensor | None = None,
                     cu_seqlens_k: Tensor | None = None) -> Tensor:
    """Causal attention, sliding-window or global, differentiable in q, k, v.

    Args:
        q: `(B, T, H, D)` queries; `(1, total_q, H, D)` with `cu_seqlens`.
        k, v: `(B, S, G, D)`, S ≥ T, in position order; the last T are the queries' own tokens, the first
            S − T the tokens before them (a carried cache: with a window only the last w − 1 of them can be
            seen). G divides H; query head h reads kv head `h // (H/G)`, never materialised where the kernel
            broadcasts. `(1, total_k, G, D)` with `cu_seqlens_k`.
        window: w ≥ 1, query i sees keys `p_i − w < j ≤ p_i`, itself included; None: all keys `j ≤ p_i`
            (global causal attention).
        scale: softmax scale, default `D^−1/2`.
        backend: "auto" (default; or `$HYBRID_WINDOW_BACKEND`), "flash", "flex", "blocked", "reference".
        cu_seqlens: `(N+1,)` integer offsets of N query sequences packed into q (B = 1), flash-attn's
            convention: strictly increasing from 0 to total_q, on q's device; or a `PackedOffsets`, checked
            already (`hybrid.kernels.varlen`: the model checks a batch's offsets once, for every layer).
        cu_seqlens_k: `(N+1,)` offsets of their keys in k (default `cu_seqlens`: no prefix). Sequence n's
            queries are the last `len_q_n` of its `len_k_n ≥ len_q_n` keys (bottom-right aligned); no query
            sees another sequence's keys, and the window counts positions within the sequence.
    Returns:
        `(B, T, H, D)` in q's dtype. Attention's state is its keys: a prefix comes in through k, v (and
        `cu_seqlens_k`), so there is no `initial_state` / `output_final_state` (the op contract's state).
    """
    check_attention(q, k, v, window)
    check_packing(q, k, cu_seqlens, cu_seqlens_k)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if q.shape[1] == 0:
        return q.new_zeros(q.shape)
    form = _FORMS[resolve_window_backend(backend, q)]
    if cu_seqlens is None:
        return form(q, k, v, window, scale)
    return form(q, k, v, window, scale, cu_seqlens=cu_seqlens, cu_seqlens_k=cu_seqlens_k)
