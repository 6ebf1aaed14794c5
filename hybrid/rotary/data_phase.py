"""Data-dependent rotation angles for the complex recurrence: each token chooses how far each pair turns.

    z_t = W x_t + b                       W: d_model → H·P (zero at init), b: (H, P)
    "pi-sigmoid":  θ_t = π · σ(z_t)       ∈ (0, π)        a token can flip a pair's sign (θ → π)
    "2pi-tanh":    θ_t = 2π · tanh(z_t)   ∈ (−2π, 2π)     both 0 and ±π are interior points
    "pi-hardsigmoid": θ_t = π · clamp(z_t/6 + ½, 0, 1) ∈ [0, π]   exactly 0 (z ≤ −3) and exactly π (z ≥ 3)

The angles are per-token increments, the ``theta`` of ``hybrid.kernels.complex_scan``: the state turns by
``e^{−iθ_t}`` at step t. With W = 0 and b set by the inverse map, θ_t equals the static rotary schedule
``init_theta`` at every token, so a model starts as VO-RoPE and learns to depart from it.

Why a sign flip matters: parity and modular counting need the state to rotate by an angle chosen by the input
(Grazzi et al., arXiv 2411.12537; Mamba-3, arXiv 2603.15569). CARoPE's increments lie in (0, 1] radian and
a static schedule ignores the input, so neither can.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hybrid.checks import check_choice
from hybrid.precision import at_least_float32

PHASE_MAPS = ("pi-sigmoid", "2pi-tanh", "pi-hardsigmoid")


def phase_from_logits(z: torch.Tensor, phase_map: str) -> torch.Tensor:
    """θ from the pre-activation z (any shape), per ``phase_map``."""
    if phase_map == "pi-sigmoid":
        return math.pi * torch.sigmoid(z)
    if phase_map == "2pi-tanh":
        return 2.0 * math.pi * torch.tanh(z)
    if phase_map == "pi-hardsigmoid":
        return math.pi * F.hardsigmoid(z)
    raise ValueError(f"phase_map: expected one of {PHASE_MAPS}, got {phase_map!r}")


def logits_from_phase(theta: torch.Tensor, phase_map: str) -> torch.Tensor:
    """The z with ``phase_from_logits(z) = theta``; theta must lie inside the map's open range (not checked on
    the meta device, where models are built only to count their parameters)."""
    theta = theta.double()
    checked = theta.device.type != "meta"
    if phase_map in ("pi-sigmoid", "pi-hardsigmoid"):
        p = theta / math.pi
        if checked and not bool(((p > 0) & (p < 1)).all()):
            raise ValueError(f"init_theta: expected angles in (0, π) for {phase_map!r}, got {theta.min()}..{theta.max()}")
        return torch.logit(p) if phase_map == "pi-sigmoid" else 6.0 * p - 3.0
    if phase_map == "2pi-tanh":
        p = theta / (2.0 * math.pi)
        if checked and not bool((p.abs() < 1).all()):
            raise ValueError(f"init_theta: expected angles in (−2π, 2π) for '2pi-tanh', got {theta.min()}..{theta.max()}")
        return torch.atanh(p)
    raise ValueError(f"phase_map: expected one of {PHASE_MAPS}, got {phase_map!r}")


class DataPhase(nn.Module):
    """Per-token, per-pair angles from the mixer input. ``increments(x)``: x ``(B, T, d_model)`` →
    θ ``(B, T, H, P)`` float32 (float64 for float64 inputs or parameters).

    ``weight`` ``(H·P, d_model)`` and ``bias`` ``(H, P)`` are plain Parameters (not an nn.Linear), so model-wide
    Linear initialisers leave the schedule-equivalent init alone; ``reset_parameters`` restores it.
    """

    def __init__(self, d_model: int, init_theta: torch.Tensor, phase_map: str = "pi-sigmoid"):
        super().__init__()
        check_choice("phase_map", phase_map, PHASE_MAPS)
        if init_theta.dim() != 2:
            raise ValueError(f"init_theta: expected shape (n_heads, n_pairs), got {tuple(init_theta.shape)}")
        self.d_model, self.phase_map = d_model, phase_map
        self.n_heads, self.n_pairs = init_theta.shape
        self.register_buffer("init_logits", logits_from_phase(init_theta, phase_map), persistent=False)  # float64
        self.weight = nn.Parameter(torch.empty(self.n_heads * self.n_pairs, d_model))
        self.bias = nn.Parameter(torch.empty(self.n_heads, self.n_pairs))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, n_pairs={self.n_pairs}, phase_map={self.phase_map!r}"

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """W = 0 and b = the inverse map of the static schedule: the first forward equals static VO-RoPE."""
        self.weight.zero_()
        self.bias.copy_(self.init_logits)

    def increments(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        dtype = torch.promote_types(at_least_float32(x).dtype, self.weight.dtype)
        dtype = torch.promote_types(dtype, torch.float32)
        z = F.linear(x.to(dtype), self.weight.to(dtype))  # (B, T, H·P)
        z = z.unflatten(-1, (self.n_heads, self.n_pairs)) + self.bias.to(dtype)  # (B, T, H, P)
        return phase_from_logits(z, self.phase_map)
