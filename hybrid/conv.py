"""Causal depthwise conv1d over (B, T, C) with a carried tail, for chunked and recurrent continuation.

    y[t, c] = bias[c] + Σ_{k<W} weight[c, k] · u[t + k, c],    u = [tail; x]   (tail: the last W−1 inputs)

so `weight[:, W−1]` multiplies the current input (the layout of `causal_conv1d`, weights interchangeable).
`conv_state` is the tail `(B, W−1, C)`, zeros at stream start, kept in the input dtype (it holds raw
inputs, so this is lossless). forward(a) then forward(b, state) equals forward(a ++ b); step() is the same
for one token.

Backends, chosen at call time by `select_conv_backend`:
- "causal_conv1d": the `causal_conv1d` package (≥ 1.4: `causal_conv1d_fn` with `initial_states`,
  `causal_conv1d_update` with a state of length ≥ W−1) when it imports, x is on CUDA, 2 ≤ W ≤ 4,
  C % 8 == 0 and x, weight are float32/float16/bfloat16. We hand it the (B, C, T) transpose of a
  contiguous (B, T, C) tensor, i.e. its channel-last layout, the only one in which it accepts
  `initial_states`; the new tail is sliced from the inputs here. `causal_conv1d_update` mutates its state
  and has no autograd, so step() uses it only when no gradient is needed, on a fresh copy of the state.
- "torch": `F.conv1d(groups=C)` on [tail; x]; any device and dtype, always available. Forced by
  `HYBRID_CONV_BACKEND=torch` or `hybrid.conv.FORCE_TORCH = True`.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_positive_int

__all__ = [
    "CausalConv1d",
    "causal_conv1d_reference",
    "select_conv_backend",
    "BACKEND_ENV",
]

BACKEND_ENV = "HYBRID_CONV_BACKEND"  # "auto" (default) or "torch"
FORCE_TORCH = False
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def _causal_conv1d_module():
    """The `causal_conv1d` package if it imports with both entry points, else None (cached)."""
    try:
        import causal_conv1d as cc
    except Exception:  # ImportError, or a build without a matching CUDA runtime
        return None
    if not (hasattr(cc, "causal_conv1d_fn") and hasattr(cc, "causal_conv1d_update")):
        return None
    return cc


def select_conv_backend(device, channels: int, width: int, *dtypes: torch.dtype) -> str:
    """'causal_conv1d' when forced off neither by env nor flag, the device is CUDA, the shape and dtypes
    (of x and weight) suit the kernel and the package imports; else 'torch'."""
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "torch"):
        raise ValueError(f"${BACKEND_ENV}: expected 'auto' or 'torch', got {choice!r}")
    if FORCE_TORCH or choice == "torch":
        return "torch"
    if torch.device(device).type != "cuda" or not 2 <= width <= 4 or channels % 8 != 0:
        return "torch"
    if not all(dt in _FUSED_DTYPES for dt in dtypes):
        return "torch"
    return "causal_conv1d" if _causal_conv1d_module() is not None else "torch"


def causal_conv1d_reference(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, conv_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Explicit loop over time. x (B, T, C), weight (C, W), bias (C,), conv_state (B, W−1, C)."""
    B, T, C = x.shape
    W = weight.shape[1]
    tail = x.new_zeros(B, W - 1, C) if conv_state is None else conv_state.to(x.dtype)
    u = torch.cat([tail, x], dim=1)  # (B, W−1+T, C)
    ys = []
    for t in range(T):
        acc = torch.zeros(B, C, dtype=x.dtype, device=x.device) if bias is None else bias.to(x.dtype).expand(B, C)
        for k in range(W):
            acc = acc + weight[:, k].to(x.dtype) * u[:, t + k]
        ys.append(acc)
    return torch.stack(ys, dim=1), u[:, T:]


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

    # --- checks -------------------------------------------------------------------------------------
    def _check_state(self, conv_state: Tensor | None, batch: int) -> None:
        want = (batch, self.width - 1, self.channels)
        if conv_state is not None and tuple(conv_state.shape) != want:
            raise ValueError(f"conv_state: expected shape {want}, got {tuple(conv_state.shape)}")

    # --- forms --------------------------------------------------------------------------------------
    def forward(self, x: Tensor, conv_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x (B, T, C), conv_state (B, W−1, C) or None (zeros) -> y (B, T, C), new conv_state (B, W−1, C)."""
        if x.dim() != 3 or x.shape[-1] != self.channels or x.shape[1] < 1:
            raise ValueError(f"x: expected shape (B, T>=1, {self.channels}), got {tuple(x.shape)}")
        B, T, C = x.shape
        W = self.width
        self._check_state(conv_state, B)
        if select_conv_backend(x.device, C, W, x.dtype, self.weight.dtype) == "causal_conv1d":
            cc = _causal_conv1d_module()
            init = None if conv_state is None else conv_state.to(x.dtype).contiguous().transpose(1, 2)  # (B, C, W−1)
            xc = x.contiguous()
            if xc.stride() != (T * C, C, 1):  # size-1 dims may keep odd strides; the kernel checks them
                xc = xc.clone(memory_format=torch.contiguous_format)
            y = cc.causal_conv1d_fn(
                xc.transpose(1, 2),  # (B, C, T), channel-last memory
                self.weight,
                self.bias,
                initial_states=init,
                activation=None,
            ).transpose(1, 2)  # (B, T, C)
            if T >= W - 1:
                new_state = x[:, T - (W - 1):]
            else:
                tail = x.new_zeros(B, W - 1, C) if conv_state is None else conv_state.to(x.dtype)
                new_state = torch.cat([tail, x], dim=1)[:, T:]  # (B, W−1, C)
            return y, new_state
        tail = x.new_zeros(B, W - 1, C) if conv_state is None else conv_state.to(x.dtype)
        u = torch.cat([tail, x], dim=1)  # (B, W−1+T, C)
        dt = torch.promote_types(x.dtype, self.weight.dtype)
        bias = None if self.bias is None else self.bias.to(dt)
        y = F.conv1d(u.transpose(1, 2).to(dt), self.weight.to(dt).unsqueeze(1), bias, groups=C)  # (B, C, T)
        return y.transpose(1, 2).to(x.dtype), u[:, T:]

    def step(self, x: Tensor, conv_state: Tensor | None) -> tuple[Tensor, Tensor]:
        """x (B, C), conv_state (B, W−1, C) or None -> y (B, C), new conv_state (B, W−1, C)."""
        if x.dim() != 2 or x.shape[-1] != self.channels:
            raise ValueError(f"x: expected shape (B, {self.channels}), got {tuple(x.shape)}")
        B, C = x.shape
        W = self.width
        self._check_state(conv_state, B)
        if conv_state is None:
            conv_state = x.new_zeros(B, W - 1, C)
        params = (self.weight,) if self.bias is None else (self.weight, self.bias)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, conv_state, *params))
        if not needs_grad and select_conv_backend(x.device, C, W, x.dtype, self.weight.dtype) == "causal_conv1d":
            state = torch.empty(B, C, W - 1, device=x.device, dtype=x.dtype)  # fresh copy: updated in place
            state.copy_(conv_state.transpose(1, 2))
            y = _causal_conv1d_module().causal_conv1d_update(x, state, self.weight, self.bias, activation=None)
            return y, state.transpose(1, 2)  # (B, W−1, C)
        window = torch.cat([conv_state.to(x.dtype), x.unsqueeze(1)], dim=1)  # (B, W, C)
        dt = torch.promote_types(x.dtype, self.weight.dtype)
        y = torch.einsum("bwc,cw->bc", window.to(dt), self.weight.to(dt))
        if self.bias is not None:
            y = y + self.bias.to(dt)
        return y.to(x.dtype), window[:, 1:]

    def extra_repr(self) -> str:
        return f"{self.channels}, width={self.width}, bias={self.bias is not None}"
