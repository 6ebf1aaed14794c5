"""RMS normalisation: the `RMSNorm` module and the weightless per-head norm ("group norm") of retention.

    rms_norm(x)[..., i] = x[..., i] / sqrt(mean_j x[..., j]² + eps) · weight[i]

Computed in at least float32 (float64 stays float64); the output has the input's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_number, check_positive_int

__all__ = ["rms_norm", "head_rms_norm", "RMSNorm"]


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """RMS-normalise `x` over its last dimension, then scale by `weight` (shape `(x.shape[-1],)`) if given.

    Through `torch.nn.functional.rms_norm`, on `x` in at least float32: on CUDA one fused kernel forward and
    one backward (`aten::_fused_rms_norm`) where the formula written out is six, each a pass over `x` and, when
    decoding, a launch; on the CPU the same ops as the formula, the same bits forward and backward
    (tests/hybrid/test_norms.py)."""
    dt = torch.promote_types(x.dtype, torch.float32)
    w = None if weight is None else weight.to(dt)
    return F.rms_norm(x.to(dt), (x.shape[-1],), w, eps).to(x.dtype)


def head_rms_norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Per-head RMS norm without weight, RetNet's "group norm" (one group per head).

    x: (B, T, H, D) -> (B, T, H, D), each (token, head) vector normalised over D. Invariant to multiplying
    `x` by any positive per-(token, head) factor c (exactly so for eps = 0; for eps > 0 the effective eps
    becomes eps / c²).
    """
    return rms_norm(x, None, eps)


class RMSNorm(nn.Module):
    """`y = x / rms(x) · weight` over the last dimension; `weight` (dim,) starts at ones."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        check_positive_int("dim", dim)
        self.dim, self.eps = dim, check_number("eps", eps, low=0)
        self.weight = nn.Parameter(torch.ones(dim))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Ones (the model's ``init_weights`` after building on the meta device)."""
        self.weight.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x: expected last dimension {self.dim}, got shape {tuple(x.shape)}")
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
