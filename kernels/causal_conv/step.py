"""The one-token step of the causal depthwise conv (decoding), beside the whole-sequence forms.

    y_t = bias + Σ_{k<W} weight[:, k] · [state; x_t][k],      new state = [state; x_t][1:]

"causal_conv1d" uses the package's `causal_conv1d_update` (on a fresh copy of the state) when no gradient is
needed; otherwise, and on "torch" / "reference", a product with the W-entry window summed over it (3 ops: an
einsum's permutes and batched matmul took 12, and a decode step is bound by its op count on a GPU).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .fused import causal_conv1d_update_fused
from .checks import check_state, check_weight_bias
from .interface import resolve_conv_backend


def causal_conv1d_step(x_t: Tensor, weight: Tensor, bias: Tensor | None = None, state: Tensor | None = None, *,
                       backend: str | None = None) -> tuple[Tensor, Tensor]:
    """x_t `(B, C)`, weight `(C, W)`, bias `(C,)` or None, state `(B, W−1, C)` or None (zeros) → y_t `(B, C)`
    in x_t's dtype and the new state `(B, W−1, C)` in x_t's dtype. Equals `causal_conv1d` on one token."""
    if not isinstance(x_t, Tensor) or x_t.dim() != 2 or not x_t.is_floating_point():
        got = f"{tuple(x_t.shape)} {x_t.dtype}" if isinstance(x_t, Tensor) else type(x_t).__name__
        raise ValueError(f"x_t: expected a floating tensor of shape (B, C), got {got}")
    check_weight_bias(weight, bias, x_t.shape[1])
    B, C = x_t.shape
    W = weight.shape[1]
    check_state("state", state, B, weight, "B")
    if state is None:
        state = x_t.new_zeros(B, W - 1, C)
    params = (weight,) if bias is None else (weight, bias)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x_t, state, *params))
    if not needs_grad and resolve_conv_backend(backend, x_t, weight) == "causal_conv1d":
        return causal_conv1d_update_fused(x_t, weight, bias, state.to(x_t.dtype))
    window = torch.cat([state.to(x_t.dtype), x_t.unsqueeze(1)], dim=1)  # (B, W, C)
    dt = torch.promote_types(x_t.dtype, weight.dtype)
    y = (window.to(dt) * weight.t().to(dt)).sum(dim=1)  # (B, W, C) · (W, C) summed over W → (B, C)
    if bias is not None:
        y = y + bias.to(dt)
    return y.to(x_t.dtype), window[:, 1:]
