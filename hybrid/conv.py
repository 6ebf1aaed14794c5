"""CausalConv1d: the causal depthwise conv of the recurrence block as a module, over the op
`hybrid.kernels.causal_conv` (which holds the math, the ways of computing it and the backend choice).

    y[t, c] = bias[c] + Σ_{k<W} weight[c, k] · u[t + k, c],    u = [tail; x]   (tail: the last W−1 inputs)

`conv_state` is the tail `(B, W−1, C)` (per packed sequence: `(N, W−1, C)`), zeros at stream start, in the
input dtype. forward(a) then forward(b, state) equals forward(a ++ b); step() is the same for one token.

The backend ("causal_conv1d" on CUDA where the package fits, else "torch") is chosen per call by
`select_conv_backend`; `HYBRID_CONV_BACKEND=torch` forces "torch".
`causal_conv1d_reference`, `select_conv_backend` and `BACKEND_ENV` stay importable from here.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from hybrid.kernels.causal_conv import BACKEND_ENV, causal_conv1d, causal_conv1d_step
from hybrid.kernels.causal_conv import causal_conv1d_reference as _reference
from hybrid.kernels.causal_conv import select_conv_backend
from hybrid.kernels.context_parallel import causal_conv1d_cp
from hybrid.kernels.varlen import device_offsets

from .checks import check_positive_int

__all__ = [
    "CausalConv1d",
    "causal_conv1d_reference",
    "select_conv_backend",
    "BACKEND_ENV",
]

def causal_conv1d_reference(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, conv_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Explicit loop over time. x (B, T, C), weight (C, W), bias (C,), conv_state (B, W−1, C) → (y, new state)."""
    return _reference(x, weight, bias, conv_state, output_final_state=True)


class CausalConv1d(nn.Module):
    """Depthwise causal conv of width `width` over `channels`; weight (C, W), bias (C,)."""

    def __init__(self, channels: int, width: int = 4, bias: bool = True):
        super().__init__()
        check_positive_int("channels", channels)
        check_positive_int("width", width)
        self.channels, self.width = channels, width
        self.weight = nn.Parameter(torch.empty(channels, width))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """U(−1/√W, 1/√W), the default of nn.Conv1d with groups=channels (fan_in = W)."""
        bound = 1.0 / math.sqrt(self.width)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def init_state(self, batch_size: int, device=None, dtype: torch.dtype | None = None) -> Tensor:
        """Zeros (B, W−1, C): the tail at stream start."""
        dtype = self.weight.dtype if dtype is None else dtype
        return torch.zeros(batch_size, self.width - 1, self.channels, device=device, dtype=dtype)

    def _check_state(self, conv_state: Tensor | None, rows: int) -> None:
        want = (rows, self.width - 1, self.channels)
        if conv_state is not None and tuple(conv_state.shape) != want:
            raise ValueError(f"conv_state: expected shape {want}, got {tuple(conv_state.shape)}")

    def _backend(self, x: Tensor) -> str:
        return select_conv_backend(x.device, self.channels, self.width, x.dtype, self.weight.dtype)

    def forward(self, x: Tensor, conv_state: Tensor | None = None, *, cu_seqlens: Tensor | None = None,
                output_final_state: bool = True, shard=None) -> tuple[Tensor, Tensor | None]:
        """x (B, T, C), conv_state (B, W−1, C) or None (zeros) -> y (B, T, C), new conv_state (B, W−1, C), or
        None when `output_final_state` is False. With `cu_seqlens` (N+1,): x is (1, total_T, C) packed, the
        states are (N, W−1, C), one per sequence, and no tap crosses a sequence boundary. With `shard` (a
        `hybrid.kernels.context_parallel.SequenceShard`): x is this rank's part of the sequence, the W − 1 inputs
        before it come from the earlier ranks, and the states are those of `causal_conv1d_cp`."""
        if x.dim() != 3 or x.shape[-1] != self.channels or x.shape[1] < 1:
            raise ValueError(f"x: expected shape (B, T>=1, {self.channels}), got {tuple(x.shape)}")
        if shard is not None:
            return causal_conv1d_cp(x, self.weight, self.bias, conv_state, shard=shard,
                                    output_final_state=output_final_state, backend=self._backend(x))
        rows = x.shape[0] if cu_seqlens is None else device_offsets(cu_seqlens).numel() - 1
        self._check_state(conv_state, rows)
        return causal_conv1d(x, self.weight, self.bias, conv_state, output_final_state=output_final_state,
                             cu_seqlens=cu_seqlens, backend=self._backend(x))

    def step(self, x: Tensor, conv_state: Tensor | None) -> tuple[Tensor, Tensor]:
        """x (B, C), conv_state (B, W−1, C) or None -> y (B, C), new conv_state (B, W−1, C)."""
        if x.dim() != 2 or x.shape[-1] != self.channels:
            raise ValueError(f"x: expected shape (B, {self.channels}), got {tuple(x.shape)}")
        self._check_state(conv_state, x.shape[0])
        return causal_conv1d_step(x, self.weight, self.bias, conv_state, backend=self._backend(x))

    def extra_repr(self) -> str:
        return f"{self.channels}, width={self.width}, bias={self.bias is not None}"
