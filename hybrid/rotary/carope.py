"""CARoPE (Veisi et al., "Context-aware Rotary Position Embedding"): context-aware rotary phases, a cumulative
sum of per-token, per-head frequencies.

    f_h(x_t) = 1 / (softplus(x_t·W + b)_h + 1) ∈ (0, 1)         W: d_model → n_heads, with bias
    φ_{h,i}(m) = φ_{h,i}(start) + Σ_{t ≤ m} f_h(x_t)^i          i = 0 … P − 1, P = rotary_dim / 2

With W = 0 and b = softplus⁻¹(base^(2/R) − 1), f = base^(−2/R) = θ_1, so f^i = θ_i and φ_i(m) is standard
RoPE with 1-indexed positions: token m (0-indexed) gets (m + 1)·θ_i, as in the seed's Σ_{t=1}^{m}.

The increments f(x_t)^i are exactly a data-dependent `theta` for `hybrid.kernels.complex_scan` (phase difference
φ(t) − φ(j) = Σ_{j<u≤t} increments), and `cos_sin_from_phases` turns the phases into 4-D cos/sin for
`apply_rotary` with any placement.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hybrid.checks import check_even_dim, check_positive_int, check_rotary_base
from hybrid.kernels.varlen import sequence_ids
from hybrid.precision import at_least_float32


def _softplus_inverse(y: float) -> float:
    """x with softplus(x) = log(1 + e^x) = y > 0, i.e. x = y + log(1 − e^(−y)), stable for all y."""
    return y + math.log(-math.expm1(-y))



def cos_sin_from_phases(phases: torch.Tensor):
    """`(cos φ, sin φ)`, each `(B, T, H, P)` float32 (float64 for float64 phases), for `apply_rotary`."""
    if phases.dim() != 4:
        raise ValueError(f"phases: expected shape (B, T, H, P), got {tuple(phases.shape)}")
    phases = at_least_float32(phases)
    return torch.cos(phases), torch.sin(phases)


def wrap_phase(phase: torch.Tensor) -> torch.Tensor:
    """``phase`` mod 2π in [−π, π), taken in float64 and returned in phase's dtype: a carried phase then keeps
    float32's full precision however long the sequence (its sum grows ~1 rad a token, and float32's spacing at
    20,000 rad is 2e-3 rad, which token-by-token decoding would otherwise accumulate)."""
    wrapped = torch.remainder(phase.double() + math.pi, 2 * math.pi) - math.pi
    return wrapped.to(phase.dtype)


class CARoPE(nn.Module):
    """Context-aware rotary phases for `n_heads` heads rotating `rotary_dim` channels each.

    Parameters `weight` `(n_heads, d_model)` and `bias` `(n_heads,)` (plain Parameters, not an nn.Linear, so
    model-wide Linear initialisers leave the RoPE-equivalent init alone; `reset_parameters` restores it).
    Everything is computed in float32 whatever x's dtype (float64 when x or the parameters are float64, for
    reference tests).
    """

    def __init__(self, d_model: int, n_heads: int, rotary_dim: int, base: float = 10000.0):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        check_even_dim("rotary_dim", rotary_dim)
        check_rotary_base("base", base)
        self.d_model, self.n_heads, self.rotary_dim = int(d_model), int(n_heads), int(rotary_dim)
        self.base = float(base)
        self.n_pairs = self.rotary_dim // 2
        self.weight = nn.Parameter(torch.empty(self.n_heads, self.d_model))
        self.bias = nn.Parameter(torch.empty(self.n_heads))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, rotary_dim={self.rotary_dim}, base={self.base:g}"

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """W = 0, b = softplus⁻¹(base^(2/R) − 1): every head starts as standard RoPE."""
        self.weight.zero_()
        self.bias.fill_(_softplus_inverse(self.base ** (2.0 / self.rotary_dim) - 1.0))

    def log_frequency(self, x: torch.Tensor) -> torch.Tensor:
        """log f(x_t) = −log(1 + softplus(x_t·W + b)), `(B, T, H)` float32, from x `(B, T, d_model)`."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        dtype = torch.promote_types(torch.promote_types(x.dtype, self.weight.dtype), torch.float32)
        with torch.autocast(x.device.type, enabled=False):  # float32 under autocast too: the phases sum these
            z = F.linear(x.to(dtype), self.weight.to(dtype), self.bias.to(dtype))  # (B, T, H)
            return -torch.log1p(F.softplus(z))

    def increments(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token phase increments f(x_t)^i = exp(i·log f(x_t)), `(B, T, H, P)` float32."""
        log_f = self.log_frequency(x)
        i = torch.arange(self.n_pairs, dtype=log_f.dtype, device=x.device)  # (P,)
        return torch.exp(log_f.unsqueeze(-1) * i)  # (B, T, H, P)

    def forward(self, x: torch.Tensor, phase: torch.Tensor | None = None):
        """Phases for x `(B, T, d_model)` continuing from `phase` `(B, H, P)` (zeros when None).

        Returns `(phases (B, T, H, P), phase_end (B, H, P))`, float32, with phases[:, m] = phase +
        Σ_{t ≤ m} increments[:, t] (inclusive), and phase_end the last of them mod 2π (`wrap_phase`). Feeding
        phase_end to the next call continues: chunked or token-by-token runs give the phases of one pass up to
        multiples of 2π (the same cos and sin), as accurately as one pass, at any length.
        """
        inc = self.increments(x)
        B, T, H, P = inc.shape
        if phase is None:
            phase = inc.new_zeros(B, H, P)
        elif phase.shape != (B, H, P):
            raise ValueError(f"phase: expected shape (B, H, P) = {(B, H, P)}, got {tuple(phase.shape)}")
        # Sum from the carried phase so that a split run adds in the same order as one pass.
        phase = phase.to(inc.dtype)
        phases = torch.cumsum(torch.cat((phase.unsqueeze(1), inc), dim=1), dim=1)[:, 1:]  # (B, T, H, P)
        phase_end = wrap_phase(phases[:, -1]) if T > 0 else phase
        return phases, phase_end

    def forward_packed(self, x: torch.Tensor, cu_seqlens: torch.Tensor, phase: torch.Tensor | None = None):
        """Phases for a packed batch x `(1, total_T, d_model)` (`hybrid.kernels.varlen`), restarting at every
        sequence from its `phase` `(N, H, P)` (zeros when None).

        Returns `(phases (1, total_T, H, P), phase_end (N, H, P))` float32, phase_end mod 2π as in `forward`.
        The running sums are taken in float64 over the whole batch and differenced at the sequence starts, so
        each sequence's phases equal its own run's to float32 rounding.
        """
        inc = self.increments(x)  # (1, T, H, P)
        _, T, H, P = inc.shape
        N = cu_seqlens.numel() - 1
        if phase is not None and phase.shape != (N, H, P):
            raise ValueError(f"phase: expected shape (N, H, P) = {(N, H, P)}, got {tuple(phase.shape)}")
        total = torch.cumsum(inc[0].double(), dim=0)  # (T, H, P)
        before = torch.cat([total.new_zeros(1, H, P), total])[cu_seqlens[:-1]]  # (N, H, P): sum before each start
        if phase is not None:
            before = before - phase.double()
        ids = sequence_ids(cu_seqlens, T)  # (T,)
        phases = (total - before[ids]).to(inc.dtype)  # (T, H, P)
        return phases.unsqueeze(0), wrap_phase(phases[cu_seqlens[1:] - 1])
