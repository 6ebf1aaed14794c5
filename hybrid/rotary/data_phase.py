"""Data-dependent rotation angles for the complex recurrence: each token chooses how far each pair turns.

    z_t = W x_t + b                       W: d_model → H·P (zero at init), b: (H, P)
    "pi-sigmoid":  θ_t = π · σ(z_t)       ∈ (0, π)        a token can flip a pair's sign (θ → π)
    "2pi-tanh":    θ_t = 2π · tanh(z_t)   ∈ (−2π, 2π)     both 0 and ±π are interior points
    "pi-hardsigmoid": θ_t = π · clamp(z_t/6 + ½, 0, 1) ∈ [0, π]   exactly 0 (z ≤ −3) and exactly π (z ≥ 3)
    "real-sign":   λ_t = 1 − 2σ(z_t) = −tanh(z_t/2) ∈ (−1, 1)    a real transition factor per pair: angle 0 or
                   π (sign), magnitude |tanh(z_t/2)| multiplying the decay γ_t (Grazzi et al.'s negative
                   eigenvalues: z → +∞ gives γ_t e^{−iπ} with the factor → 1)

Options (``DataPhase(..., init=, round_to=, round_at_inference=)``):

- ``init="schedule"`` (default): W = 0 and b the inverse map of the static schedule, so θ_t equals the rotary
  schedule at every token; ``"steepest"``: b = 0, every pair starts where its map is steepest (π/2 for the
  π·σ maps). "real-sign" starts at z = −3 (factor 0.905, angle 0) and has no schedule to match.
- ``round_to=n`` (n ≥ 2): the angles are rounded to the nearest multiple of 2π/n in the forward pass with a
  straight-through gradient (n = 2: {0, π}). It acts in training while ``rounding_active`` (the trainer may
  switch it on late) and at inference only with ``round_at_inference=True``.

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

from hybrid.checks import check_bool, check_choice, check_int
from hybrid.computed_buffers import WithComputedBuffers, register_computed_buffer
from hybrid.precision import at_least_float32

PHASE_MAPS = ("pi-sigmoid", "2pi-tanh", "pi-hardsigmoid", "real-sign")
PHASE_INITS = ("schedule", "steepest")
REAL_SIGN_INIT = -3.0  # "real-sign" starts with factor |tanh(−3/2)| = 0.905 and angle 0
MIN_REAL_FACTOR = 1e-6  # |λ_t| is floored here before its log (a pair that is zeroed by the token)


def phase_from_logits(z: torch.Tensor, phase_map: str) -> torch.Tensor:
    """θ from the pre-activation z (any shape), per ``phase_map``."""
    if phase_map == "pi-sigmoid":
        return math.pi * torch.sigmoid(z)
    if phase_map == "2pi-tanh":
        return 2.0 * math.pi * torch.tanh(z)
    if phase_map == "pi-hardsigmoid":
        return math.pi * F.hardsigmoid(z)
    if phase_map == "real-sign":
        return math.pi * (z > 0).to(z.dtype)  # the sign of −tanh(z/2); no gradient (the magnitude carries it)
    raise ValueError(f"phase_map: expected one of {PHASE_MAPS}, got {phase_map!r}")


def real_sign_log_factor(z: torch.Tensor) -> torch.Tensor:
    """log |1 − 2σ(z)| = log |tanh(z/2)|, floored at log(MIN_REAL_FACTOR): the "real-sign" map's magnitude, added
    to log γ_t. With the angle π·[z > 0] it gives the transition γ_t·(1 − 2σ(z)), whose derivative in z is smooth."""
    return torch.log(torch.tanh(0.5 * z).abs().clamp_min(MIN_REAL_FACTOR))


def round_angles(theta: torch.Tensor, round_to: int) -> torch.Tensor:
    """θ rounded to the nearest multiple of 2π/round_to in value, with the identity's gradient (straight-through)."""
    quantum = 2.0 * math.pi / round_to
    return theta + (torch.round(theta / quantum) * quantum - theta).detach()


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
    if phase_map == "real-sign":
        return torch.full_like(theta, REAL_SIGN_INIT)
    raise ValueError(f"phase_map: expected one of {PHASE_MAPS}, got {phase_map!r}")


class DataPhase(WithComputedBuffers):
    """Per-token, per-pair angles from the mixer input. ``increments(x)``: x ``(B, T, d_model)`` →
    θ ``(B, T, H, P)`` float32 (float64 for float64 inputs or parameters).

    ``weight`` ``(H·P, d_model)`` and ``bias`` ``(H, P)`` are plain Parameters (not an nn.Linear), so model-wide
    Linear initialisers leave the schedule-equivalent init alone; ``reset_parameters`` restores it.
    """

    def __init__(self, d_model: int, init_theta: torch.Tensor, phase_map: str = "pi-sigmoid", *,
                 init: str = "schedule", round_to: int = 0, round_at_inference: bool = False):
        super().__init__()
        check_choice("phase_map", phase_map, PHASE_MAPS)
        check_choice("init", init, PHASE_INITS)
        check_phase_rounding(phase_map, round_to, round_at_inference)
        if init == "steepest" and phase_map == "real-sign":
            raise ValueError("init: expected 'schedule' with phase_map='real-sign' (its steepest point is the "
                             "zero transition), got 'steepest'")
        self.init, self.round_to, self.round_at_inference = init, round_to, round_at_inference
        self.rounding_active = True  # training rounds (round_to > 0) while this is set; see set_phase_rounding
        if init_theta.dim() != 2:
            raise ValueError(f"init_theta: expected shape (n_heads, n_pairs), got {tuple(init_theta.shape)}")
        self.d_model, self.phase_map = d_model, phase_map
        if init_theta.device.type == "meta":
            raise ValueError("init_theta: expected angles with values (on any real device; the module itself may "
                             "be built on the meta device), got a tensor on the meta device")
        self.n_heads, self.n_pairs = init_theta.shape
        logits = logits_from_phase(init_theta.cpu(), phase_map)  # float64, on the host
        if init == "steepest":
            logits = torch.zeros_like(logits)
        register_computed_buffer(self, "init_logits", logits)
        self.weight = nn.Parameter(torch.empty(self.n_heads * self.n_pairs, d_model))
        self.bias = nn.Parameter(torch.empty(self.n_heads, self.n_pairs))
        self.reset_parameters()

    def extra_repr(self) -> str:
        extra = f", init={self.init!r}" if self.init != "schedule" else ""
        if self.round_to:
            extra += f", round_to={self.round_to}, round_at_inference={self.round_at_inference}"
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_pairs={self.n_pairs}, "
                f"phase_map={self.phase_map!r}{extra}")

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """W = 0 and b = the init's logits (by default the inverse map of the static schedule: the first forward
        equals static VO-RoPE)."""
        self.weight.zero_()
        self.bias.copy_(self.init_logits)

    def rounds(self) -> bool:
        """Whether this forward rounds the angles: in training while ``rounding_active``, at inference only when
        ``round_at_inference``."""
        if not self.round_to:
            return False
        return self.rounding_active if self.training else self.round_at_inference

    def increments(self, x: torch.Tensor) -> torch.Tensor:
        """θ ``(B, T, H, P)`` (see ``transition`` for the "real-sign" map's magnitude)."""
        return self.transition(x)[0]

    def transition(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(θ ``(B, T, H, P)``, the log-magnitude factor to add to log γ_t ``(B, T, H, P)``, or None: every map but
        "real-sign" only turns the state)."""
        z = self.logits(x)
        theta = phase_from_logits(z, self.phase_map)
        if self.rounds():
            theta = round_angles(theta, self.round_to)
        log_factor = real_sign_log_factor(z) if self.phase_map == "real-sign" else None
        return theta, log_factor

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """z = W x + b, ``(B, T, H, P)``."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        dtype = torch.promote_types(at_least_float32(x).dtype, self.weight.dtype)
        dtype = torch.promote_types(dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):  # float32 under autocast too (the angles' precision)
            z = F.linear(x.to(dtype), self.weight.to(dtype))  # (B, T, H·P)
        return z.unflatten(-1, (self.n_heads, self.n_pairs)) + self.bias.to(dtype)  # (B, T, H, P)


def check_phase_rounding(phase_map: str, round_to, round_at_inference) -> None:
    """``round_to`` is 0 (off) or an int ≥ 2, never with "real-sign" (its angles are exact already);
    ``round_at_inference`` a bool that needs ``round_to``."""
    check_int("phase_round", round_to, low=0, what="0 (off) or an int >= 2")
    if round_to == 1:
        raise ValueError("phase_round: expected 0 (off) or an int >= 2, got 1")
    if round_to and phase_map == "real-sign":
        raise ValueError(f"phase_round: has no effect with phase_map='real-sign' (its angles are 0 or π), got "
                         f"{round_to}")
    check_bool("phase_round_at_inference", round_at_inference)
    if round_at_inference and not round_to:
        raise ValueError("phase_round_at_inference: has no effect with phase_round=0, got True")


def set_phase_rounding(model: nn.Module, active: bool) -> int:
    """Switch the training-time rounding of every `DataPhase` in ``model`` on or off; returns how many round."""
    n = 0
    for module in model.modules():
        if isinstance(module, DataPhase) and module.round_to:
            module.rounding_active = bool(active)
            n += 1
    return n
