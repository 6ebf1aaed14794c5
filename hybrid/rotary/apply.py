"""Applying a rotation: `apply_rotary`, plus the angle helpers every schedule shares.

A rotary pair is a complex number. With `layout="interleaved"` pair k of the rotated part is
`(x[2k], x[2k+1])`; with `layout="half"` (the rotate_half convention) it is `(x[k], x[k + R/2])`.
Rotating pair k by φ_k:

    (x0, x1) -> (x0·cos φ_k − x1·sin φ_k,  x0·sin φ_k + x1·cos φ_k)        (R, forward)
    (x0, x1) -> (x0·cos φ_k + x1·sin φ_k, −x0·sin φ_k + x1·cos φ_k)        (Rᵀ, inverse=True)

Only the first R = rotary_dim channels rotate; the rest pass through bit-identical.
"""
from __future__ import annotations

import torch

from hybrid.checks import check_choice, check_even_dim, check_float_tensor

LAYOUTS = ("interleaved", "half")


def check_layout(name: str, value) -> str:
    """A rotary layout, one of ``LAYOUTS``: how the channels of a head pair up (see the module docstring)."""
    check_choice(name, value, LAYOUTS)
    return value


def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Angles `φ[..., k] = position · inv_freq[k]`, float64.

    positions: integer tensor of any shape (int64 positions are exact); inv_freq: `(P,)`.
    Returns `(*positions.shape, P)` float64. The product of an exact integer and a float32 frequency is
    exact in float64 (up to 2^29), so large offsets keep their precision; round to float32 only after
    cos/sin (`cos_sin_from_angles`).
    """
    if positions.is_floating_point() or positions.is_complex():
        raise ValueError(f"positions: expected an integer tensor, got dtype {positions.dtype}")
    if inv_freq.dim() != 1:
        raise ValueError(f"inv_freq: expected a 1-D tensor (P,), got shape {tuple(inv_freq.shape)}")
    pos = positions.to(torch.float64).unsqueeze(-1)  # (..., 1)
    return pos * inv_freq.to(device=positions.device, dtype=torch.float64)  # (..., P)


def cos_sin_from_angles(angles: torch.Tensor, dtype: torch.dtype = torch.float32):
    """`(cos φ, sin φ)` evaluated in the angles' own precision, then cast to `dtype` (float32)."""
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def _check_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half_r: int):
    """Validate cos/sin against x `(B, T, H, D)`; return them as 4-D views broadcastable to (B,T,H,R/2)."""
    if cos.shape != sin.shape:
        raise ValueError(
            f"sin: expected the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}"
        )
    if not cos.is_floating_point():
        raise ValueError(f"cos: expected a float tensor, got dtype {cos.dtype}")
    B, T, H, _ = x.shape
    if cos.dim() == 2:
        if cos.shape != (T, half_r):
            raise ValueError(
                f"cos: expected shape (T, R/2) = ({T}, {half_r}), got {tuple(cos.shape)}"
            )
        return cos.reshape(1, T, 1, half_r), sin.reshape(1, T, 1, half_r)  # (1, T, 1, R/2)
    if cos.dim() == 4:
        target = (B, T, H, half_r)
        ok = all(c == t or c == 1 for c, t in zip(cos.shape, target)) and cos.shape[-1] == half_r
        if not ok:
            raise ValueError(
                f"cos: expected a shape broadcastable to (B, T, H, R/2) = {target}, got {tuple(cos.shape)}"
            )
        return cos, sin
    raise ValueError(f"cos: expected 2-D (T, R/2) or 4-D (B, T, H, R/2), got {cos.dim()}-D")


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    inverse: bool = False,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Rotate the rotary pairs of `x` by the angles whose cos/sin are given.

    x: `(B, T, H, D)`. cos, sin: float32 `(T, R/2)` (shared by batch and heads) or 4-D broadcastable to
    `(B, T, H, R/2)`, with `R = rotary_dim or D` (even, ≤ D). `inverse=True` applies Rᵀ (rotation by −φ).
    Products are taken in float32 (float64 if x or cos is float64); the result has x's dtype, and channels
    `R:` are x's own values, untouched.
    """
    check_float_tensor("x", x)  # an integer tensor would be rotated and truncated back to integers
    if x.dim() != 4:
        raise ValueError(f"x: expected shape (B, T, H, D), got {tuple(x.shape)}")
    check_layout("layout", layout)
    D = x.shape[-1]
    R = D if rotary_dim is None else check_even_dim("rotary_dim", rotary_dim, at_most=D, at_most_name="D")
    cos, sin = _check_cos_sin(x, cos, sin, R // 2)

    # float64 if either is, else float32 (what promoting both with float32 gives, without two dispatched calls)
    ctype = torch.float64 if torch.float64 in (x.dtype, cos.dtype) else torch.float32
    cos, sin = cos.to(ctype), sin.to(ctype)
    if inverse:
        sin = -sin
    xr = (x if R == D else x[..., :R]).to(ctype)
    if layout == "interleaved":
        # (x0·cos + x1·(−sin), x1·cos + x0·sin): the same two products and one addition per output as
        # (x0·cos − x1·sin, x0·sin + x1·cos), so the same bits, in 8 ops instead of 12 (a decode step is bound
        # by its op count on a GPU)
        pairs = xr.unflatten(-1, (R // 2, 2))  # (B, T, H, R/2, 2)
        signed_sin = torch.stack((-sin, sin), dim=-1)  # (…, R/2, 2)
        out = (pairs * cos.unsqueeze(-1) + pairs.flip(-1) * signed_sin).flatten(-2)  # (B, T, H, R)
    else:
        x0, x1 = xr[..., : R // 2], xr[..., R // 2 :]
        out = torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)  # (B, T, H, R)
    out = out.to(x.dtype)
    if R == D:
        return out
    return torch.cat((out, x[..., R:]), dim=-1)  # (B, T, H, D)
