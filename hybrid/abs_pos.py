"""Absolute position embeddings, added to the token embedding: a learned table or fixed sinusoids.

    pos = AbsolutePositions("sinusoidal", d_model=128)
    h = embed(ids) + pos(offset, T)                   # (B, T, d) + (T, d), positions offset … offset+T−1

- ``"learned"``: one trained vector per position, ``max_len`` of them (Devlin et al.); a position ≥ ``max_len``
  has no vector, and asking for one is an error.
- ``"sinusoidal"``: Vaswani et al.'s fixed table, ``PE(p, 2i) = sin(p·ω_i)``, ``PE(p, 2i+1) = cos(p·ω_i)``,
  ``ω_i = 10000^(−2i/d)``, for any position (it extrapolates). It is scaled by ``scale`` (the model passes its
  ``init_std·√2``), so that each coordinate's RMS equals the token embeddings' and the learned table's at
  initialisation; unscaled, the sinusoids would be ~50× the tokens and the pre-norm would see mostly position.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .checks import check_positive_int, reads_back

ABS_POS_KINDS = ("learned", "sinusoidal")


def sinusoidal_table(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """``(n, dim)`` float64 sinusoids at integer ``positions`` ``(n,)``; ``dim`` even."""
    even = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)  # (dim/2,)
    omega = torch.pow(10000.0, -even / dim)  # (dim/2,)
    angles = positions.to(torch.float64)[:, None] * omega  # (n, dim/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (n, dim): sin, cos interleaved


class AbsolutePositions(nn.Module):
    """``forward(offset, length) -> (length, d_model)``: the vectors of positions offset … offset+length−1."""

    def __init__(self, kind: str, d_model: int, *, max_len: int | None = None, scale: float = 1.0):
        super().__init__()
        if kind not in ABS_POS_KINDS:
            raise ValueError(f"kind: expected one of {ABS_POS_KINDS}, got {kind!r}")
        check_positive_int("d_model", d_model)
        if kind == "learned":
            check_positive_int("max_len", max_len)
            self.table = nn.Embedding(max_len, d_model)
        else:
            if d_model % 2:
                raise ValueError(f"d_model: sinusoids come in sin/cos pairs, expected an even number, got {d_model}")
            if max_len is not None:
                raise ValueError(f"max_len: sinusoids have no length limit, expected None, got {max_len!r}")
        self.kind, self.d_model, self.max_len, self.scale = kind, d_model, max_len, float(scale)

    def extra_repr(self) -> str:
        return f"{self.kind!r}, d_model={self.d_model}, max_len={self.max_len}, scale={self.scale:g}"

    def forward(self, offset: int, length: int, device=None, dtype=None) -> torch.Tensor:
        end = offset + length
        if self.kind == "learned":
            if end > self.max_len:
                raise ValueError(
                    f"positions: learned absolute positions cover 0 … {self.max_len - 1} (abs_pos_max_len), "
                    f"got positions up to {end - 1}"
                )
            ids = torch.arange(offset, end, device=self.table.weight.device)
            return self.table(ids)  # (length, d_model)
        return self.at(torch.arange(offset, end), device=device, dtype=dtype)  # (length, d_model)

    def at(self, positions: torch.Tensor, device=None, dtype=None) -> torch.Tensor:
        """The vectors ``(n, d_model)`` at integer ``positions`` ``(n,)``, computed where the positions are, with
        nothing read back to the host off the CPU (a ragged batch's decode step: one position per row). A learned
        table checks its end on the device there (the device raises), and on the CPU in one line."""
        if self.kind == "learned":
            message = f"positions: learned absolute positions cover 0 … {self.max_len - 1} (abs_pos_max_len)"
            if not reads_back(positions):
                torch._assert_async((positions < self.max_len).all(), message)
            elif positions.numel() and int(positions.max()) >= self.max_len:
                raise ValueError(f"{message}, got positions up to {int(positions.max())}")
            return self.table(positions.to(self.table.weight.device))  # (n, d_model)
        table = sinusoidal_table(positions, self.d_model) * self.scale  # (n, d_model)
        return table.to(device=device, dtype=dtype if dtype is not None else torch.get_default_dtype())


def packed_positions(module: "AbsolutePositions", positions: torch.Tensor, bound: int, device=None, dtype=None):
    """The vectors ``(n, d_model)`` at integer ``positions`` ``(n,)`` (each < ``bound``): rows of the table for
    positions 0 … bound − 1, so a packed batch gets each sequence's own positions.

    ``bound`` may be loose (a packed batch's total length bounds every position in it). A learned table ends at
    ``max_len``: past it the bound is tightened to the largest position given, so documents that each fit are
    served however long the batch, and a position that does not fit is the usual error."""
    if module.kind == "learned" and bound > module.max_len:
        bound = int(positions.max()) + 1  # a host sync, only when the loose bound overruns the table
    return module(0, bound, device=device, dtype=dtype)[positions.to(device) if device is not None else positions]


def sinusoidal_scale(init_std: float) -> float:
    """The sinusoid amplitude whose per-coordinate RMS (amplitude/√2) is ``init_std``."""
    return init_std * math.sqrt(2.0)
