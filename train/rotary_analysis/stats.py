"""Streaming per-channel and per-pair statistics of queries or keys, in memory independent of the corpus size.

`ProjectionStats.update(x, cos, sin)` takes one batch of pre-rotation vectors x `(B, T, H, D)` and the rotation
that attention applies to them (cos/sin `(T, P)` or broadcastable to `(B, T, H, P)`), and accumulates, per head:

- per channel `(H, D)`: Σx, Σ|x|, max|x| before rotation, Σ|R x|, max|R x| after it;
- per rotary pair `(H, P)`: Σ of the unit vectors x/|x| (for the circular standard deviation) and their count.

Everything is summed in float64. `pairs(x, layout, rotary_dim)` views the rotary channels as 2-vectors
`(..., P, 2)` in the model's own pair order (pair i rotates with θ_i), for either layout.
"""
from __future__ import annotations

import math

import torch

from hybrid.rotary import apply_rotary, check_layout


def pairs(x: torch.Tensor, layout: str, rotary_dim: int) -> torch.Tensor:
    """The rotary pairs of x `(..., D)` as `(..., P, 2)`, P = rotary_dim / 2, in pair order i = 0 … P − 1."""
    check_layout("layout", layout)
    P = rotary_dim // 2
    if layout == "interleaved":
        return x[..., :rotary_dim].unflatten(-1, (P, 2))  # (..., P, 2)
    return torch.stack((x[..., :P], x[..., P:rotary_dim]), dim=-1)  # (..., P, 2)


def circular_std(unit_sum: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Circular standard deviation √(−2 ln R̄), R̄ = |Σ u| / n (Mardia & Jupp), from unit-vector sums `(..., 2)`.

    NaN where no vector was seen; +inf where the mean resultant length is 0.
    """
    mean_length = unit_sum.norm(dim=-1) / count.clamp(min=1)
    std = torch.sqrt(-2.0 * torch.log(mean_length.clamp(max=1.0)))
    return torch.where(count > 0, std, torch.full_like(std, math.nan))


class ProjectionStats:
    """Running statistics of one projection (the queries or the keys of one attention layer)."""

    def __init__(self, n_heads: int, head_dim: int, rotary_dim: int, layout: str):
        check_layout("layout", layout)
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(f"rotary_dim: expected an even int in [2, head_dim={head_dim}], got {rotary_dim}")
        self.n_heads, self.head_dim, self.rotary_dim, self.layout = n_heads, head_dim, rotary_dim, layout
        H, D, P = n_heads, head_dim, rotary_dim // 2
        f64 = dict(dtype=torch.float64)
        self.count = 0
        self.sum = torch.zeros(H, D, **f64)
        self.sum_abs = torch.zeros(H, D, **f64)
        self.max_abs = torch.zeros(H, D, **f64)
        self.sum_abs_rotated = torch.zeros(H, D, **f64)
        self.max_abs_rotated = torch.zeros(H, D, **f64)
        self.unit_sum = torch.zeros(H, P, 2, **f64)
        self.unit_count = torch.zeros(H, P, **f64)

    @torch.no_grad()
    def update(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Add x `(B, T, H, D)` (pre-rotation) rotated by cos/sin (`(T, P)` or 4-D, as `apply_rotary` takes)."""
        if x.dim() != 4 or x.shape[2:] != (self.n_heads, self.head_dim):
            raise ValueError(f"x: expected (B, T, {self.n_heads}, {self.head_dim}), got {tuple(x.shape)}")
        x = x.detach()
        rotated = apply_rotary(x.to(torch.float64), cos.to(torch.float64), sin.to(torch.float64),
                               layout=self.layout, rotary_dim=self.rotary_dim)
        x = x.to(torch.float64)
        flat, flat_rot = x.flatten(0, 1), rotated.flatten(0, 1)  # (B·T, H, D)
        self.count += flat.shape[0]
        self.sum += flat.sum(0).cpu()
        self.sum_abs += flat.abs().sum(0).cpu()
        self.sum_abs_rotated += flat_rot.abs().sum(0).cpu()
        if flat.shape[0]:
            self.max_abs = torch.maximum(self.max_abs, flat.abs().amax(0).cpu())
            self.max_abs_rotated = torch.maximum(self.max_abs_rotated, flat_rot.abs().amax(0).cpu())
        v = pairs(flat, self.layout, self.rotary_dim)  # (B·T, H, P, 2)
        norm = v.norm(dim=-1, keepdim=True)  # (B·T, H, P, 1)
        seen = norm > 0
        self.unit_sum += torch.where(seen, v / norm.clamp(min=1e-300), 0.0).sum(0).cpu()
        self.unit_count += seen[..., 0].sum(0).to(torch.float64).cpu()

    def mean(self) -> torch.Tensor:
        """Mean vector per channel `(H, D)`."""
        return self.sum / max(self.count, 1)

    def mean_pairs(self) -> torch.Tensor:
        """Mean 2-vector per rotary pair `(H, P, 2)` (the seed's q̄_i or k̄_i)."""
        return pairs(self.mean(), self.layout, self.rotary_dim)

    def angle_std(self) -> torch.Tensor:
        """Circular standard deviation of the per-token pair angles `(H, P)`."""
        return circular_std(self.unit_sum, self.unit_count)

    def channel_summary(self) -> dict[str, torch.Tensor]:
        """Per-channel `(H, D)` mean / max |x| before (`*_abs`) and after rotation (`*_abs_rotated`)."""
        n = max(self.count, 1)
        return {"mean_abs": self.sum_abs / n, "max_abs": self.max_abs.clone(),
                "mean_abs_rotated": self.sum_abs_rotated / n, "max_abs_rotated": self.max_abs_rotated.clone()}
