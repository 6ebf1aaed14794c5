"""SwiGLU feed-forward block: `y = W_down(silu(W_gate x) ⊙ W_up x)`.

Hidden-size rule: an explicit `hidden` is used as given. Otherwise
`hidden = multiple_of · ceil(mlp_ratio · d_model / multiple_of)`; with the default `mlp_ratio = 8/3` the
three matrices hold ≈ 8·d_model² weights, like a GELU MLP of width 4·d_model, and `multiple_of = 32` keeps
the width friendly to tensor cores without inflating small models much (d_model 64 → 192, 128 → 352,
512 → 1376, 768 → 2048).
"""
from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_number, check_positive_int

__all__ = ["SwiGLU", "swiglu_hidden"]


def swiglu_hidden(d_model: int, mlp_ratio: float = 8 / 3, multiple_of: int = 32) -> int:
    """The default hidden width: `mlp_ratio · d_model` rounded up to a multiple of `multiple_of`."""
    check_positive_int("d_model", d_model)
    check_positive_int("multiple_of", multiple_of)
    check_number("mlp_ratio", mlp_ratio, low=0, low_open=True)
    return multiple_of * math.ceil(mlp_ratio * d_model / multiple_of)


class SwiGLU(nn.Module):
    """x (..., d_model) -> (..., d_model) through width `hidden` (see the module docstring for the rule)."""

    def __init__(
        self,
        d_model: int,
        hidden: int | None = None,
        mlp_ratio: float = 8 / 3,
        multiple_of: int = 32,
        bias: bool = False,
    ):
        super().__init__()
        if hidden is None:
            hidden = swiglu_hidden(d_model, mlp_ratio, multiple_of)
        else:
            check_positive_int("d_model", d_model)
            check_positive_int("hidden", hidden)
        self.d_model, self.hidden = d_model, hidden
        self.w_gate = nn.Linear(d_model, hidden, bias=bias)
        self.w_up = nn.Linear(d_model, hidden, bias=bias)
        self.w_down = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected last dimension {self.d_model}, got shape {tuple(x.shape)}")
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
