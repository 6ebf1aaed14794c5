"""The geometry of one rotary feature (Jonasson's rotary offset features, section 3): angle φ, offset curve d_i(p), Definition 3.1, bounds.

A rotary feature is one pair i of one head, with frequency θ_i, mean (pre-rotation) query q̄ and key k̄, each a
2-vector `(x0, x1)` in the pair's own coordinates: `hybrid.rotary.apply_rotary` rotates `(x0, x1)` by
`R(α) = [[cos α, −sin α], [sin α, cos α]]`, counter-clockwise.

**The sign of eq. (14).** Attention scores a query at position m against a key at n = m − p as
`(R(mθ) q)ᵀ (R(nθ) k) = qᵀ R(−pθ) k = (R(pθ) q)ᵀ k`, which is the seed's eq. (13), `d_i(p) = (R(pθ_i) q̄)ᵀ k̄`.
With φ the counter-clockwise angle from q̄ to k̄, rotating q̄ forward by pθ closes that angle:

    d_i(p) = |q̄| |k̄| cos(φ_i − θ_i p)          (the seed prints φ_i + θ_i p; its bound (16) needs the minus)

`tests/train/rotary_analysis/test_geometry.py` checks this against `apply_rotary` itself.

**Definition 3.1** (rotary offset feature): `d_i(p) < d_i(0)` for every integer `0 < p ≤ p_max`. It is tested
exactly through the sign of `d_i(0) − d_i(p) = −2|q̄||k̄| sin(φ − pθ/2) sin(pθ/2)` (no cancellation
near ties).

**Bounds.** Upper (15): `θ_i < 2π / p_max`. Lower (16): `φ_i > π + p_max θ_i / 2` (relaxed: minus 0.1 rad).
For real-valued p in (0, p_max], Definition 3.1 holds exactly when the lower bound does (which implies the upper
bound). For the integer positions of the definition the lower bound stays sufficient; the converse can fail
only when one step θ jumps over the whole arc where d_i(p) ≥ d_i(0), of length 2·min(φ, 2π − φ) (aliasing of
high frequencies; e.g. q̄ ∥ k̄ with φ = 2π satisfies the definition at any θ that is not a rational multiple
of 2π with small denominator).

Ties. Comparisons with a bound are strict up to a relative `TIE_RTOL` (Definition 3.1: sines within `ANGLE_TOL`
rad of zero), so that values equal to the bound
up to float rounding (θ = 2π/p_max, φ = π, a full turn at p = p_max) count as ties, i.e. as failing.
Angles φ are in (0, 2π]: q̄ ∥ k̄ gives φ = 2π, and a zero vector gives φ = 2π (d_i ≡ 0 then, never an
offset feature).
"""
from __future__ import annotations

import math

import torch

from hybrid.checks import check_int

TIE_RTOL = 1e-10  # bounds: relative tie tolerance
ANGLE_TOL = 1e-9  # Definition 3.1: radians within which a sine counts as zero
RELAXATION = 0.1  # radians, the seed's relaxed lower bound
TWO_PI = 2.0 * math.pi


def _f64(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


def _check_pairs(name: str, x: torch.Tensor) -> torch.Tensor:
    x = _f64(x)
    if x.dim() == 0 or x.shape[-1] != 2:
        raise ValueError(f"{name}: expected mean 2-vectors of shape (..., 2), got {tuple(x.shape)}")
    return x


def _check_p_max(p_max) -> int:
    return check_int("p_max", p_max, low=1, what="a positive int (the context length)")


def pair_angle(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """φ ∈ (0, 2π]: the counter-clockwise angle from q to k, for q, k `(..., 2)`; returns `(...)` float64."""
    q, k = _check_pairs("q", q), _check_pairs("k", k)
    cross = q[..., 0] * k[..., 1] - q[..., 1] * k[..., 0]
    dot = (q * k).sum(-1)
    phi = torch.remainder(torch.atan2(cross, dot), TWO_PI)
    return torch.where(phi <= 0, torch.full_like(phi, TWO_PI), phi)


def offset_curve(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """d_i(p) = (R(pθ_i) q̄_i)ᵀ k̄_i = |q̄||k̄| cos(φ_i − θ_i p).

    q, k: `(..., 2)`; theta: broadcastable to `(...)`; positions: `(n,)` (any real p). Returns `(..., n)` float64.
    Summing over the pair axis gives D(p).
    """
    q, k = _check_pairs("q", q), _check_pairs("k", k)
    radius = q.norm(dim=-1) * k.norm(dim=-1)
    phi = pair_angle(q, k)
    angle = phi.unsqueeze(-1) - _f64(theta).unsqueeze(-1) * _f64(positions)  # (..., n)
    return radius.unsqueeze(-1) * torch.cos(angle)


def positional_attention(total: torch.Tensor, head_dim: int, scale: float | None = None,
                         window: int | None = None) -> torch.Tensor:
    """The seed's positional attention pattern: `softmax_n(D(m − n) · scale)` over keys n ≤ m.

    total: D(p) for p = 0 … T − 1, `(T,)`; scale defaults to head_dim^−1/2; window: a sliding window w keeps
    only the keys with m − n < w, as the layer attends. Returns `(T, T)` float64 (rows are queries m, columns
    keys n; zero above the diagonal and past the window).
    """
    total = _f64(total)
    T = total.shape[-1]
    scale = head_dim ** -0.5 if scale is None else scale
    m = torch.arange(T)
    offsets = m[:, None] - m[None, :]  # (T, T) = m − n
    logits = total[offsets.clamp(min=0)] * scale
    outside = (offsets < 0) if window is None else (offsets < 0) | (offsets >= window)
    logits = logits.masked_fill(outside, float("-inf"))
    return torch.softmax(logits, dim=-1)


def upper_bound(theta: torch.Tensor, p_max: int) -> torch.Tensor:
    """Bound (15), `θ < 2π / p_max` (bool, strict up to TIE_RTOL)."""
    p_max = _check_p_max(p_max)
    return _f64(theta) * p_max < TWO_PI * (1.0 - TIE_RTOL)


def lower_bound(theta: torch.Tensor, p_max: int) -> torch.Tensor:
    """The angle of bound (16), `π + p_max θ / 2` (float64); a feature meets it when φ exceeds it."""
    p_max = _check_p_max(p_max)
    return math.pi + p_max * _f64(theta) / 2.0


def above(phi: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """`φ > bound`, strict up to TIE_RTOL (bool)."""
    bound = _f64(bound)
    return _f64(phi) > bound + TIE_RTOL * bound.abs()


def _strict_sign_of_sin(x: torch.Tensor) -> torch.Tensor:
    """sign(sin x) as −1, 0, +1, with 0 for x within ANGLE_TOL of a multiple of π (a tie)."""
    r = torch.remainder(x, TWO_PI)
    positive = (r > ANGLE_TOL) & (r < math.pi - ANGLE_TOL)
    negative = (r > math.pi + ANGLE_TOL) & (r < TWO_PI - ANGLE_TOL)
    return positive.to(torch.int8) - negative.to(torch.int8)


def is_rotary_offset_feature(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor, p_max: int,
                             *, block: int = 1 << 22) -> torch.Tensor:
    """Definition 3.1, exactly: `d_i(p) < d_i(0)` for all integers `0 < p ≤ p_max` (bool `(...)`).

    q, k `(..., 2)`, theta broadcastable to `(...)`. Since d_i(0) − d_i(p) = −2|q̄||k̄| sin(φ − pθ/2) sin(pθ/2),
    the test is that the two sines have strictly opposite signs at every p (angles within ANGLE_TOL of a
    multiple of π are ties). Evaluated in blocks of about `block` (feature, p) values.
    """
    p_max = _check_p_max(p_max)
    q, k = _check_pairs("q", q), _check_pairs("k", k)
    phi = pair_angle(q, k)
    theta = _f64(theta).expand_as(phi).reshape(-1)
    phi_flat = phi.reshape(-1)
    ok = (q.norm(dim=-1) * k.norm(dim=-1)).reshape(-1) > 0
    step = max(1, block // max(1, phi_flat.numel()))
    for start in range(1, p_max + 1, step):
        p = torch.arange(start, min(start + step, p_max + 1), dtype=torch.float64)  # (n,)
        half = theta[:, None] * p[None, :] / 2.0  # (F, n)
        sign = _strict_sign_of_sin(phi_flat[:, None] - half) * _strict_sign_of_sin(half)  # (F, n)
        ok &= (sign < 0).all(dim=1)
        if not bool(ok.any()):
            break
    return ok.reshape(phi.shape)
