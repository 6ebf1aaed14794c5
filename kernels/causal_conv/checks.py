"""The argument checks of the causal conv (each op folder's checks live in its ``checks.py``), in one-line errors
naming the argument."""
from __future__ import annotations

from torch import Tensor

__all__ = ["check_input", "check_weight_bias", "check_state"]


def check_input(x) -> None:
    if not isinstance(x, Tensor) or x.dim() != 3 or not x.is_floating_point():
        got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x: expected a floating tensor of shape (B, T, C), got {got}")


def check_weight_bias(weight, bias, channels: int | None = None) -> None:
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] < 1 or (
            channels is not None and weight.shape[0] != channels):
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight: expected shape (C={channels if channels is not None else 'C'}, W ≥ 1), got {got}")
    C = weight.shape[0]
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (C,)):
        got = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(f"bias: expected None or shape (C={C},), got {got}")


def check_state(name: str, state, rows: int, weight: Tensor, what: str) -> None:
    want = (rows, weight.shape[1] - 1, weight.shape[0])
    if state is not None and (not isinstance(state, Tensor) or tuple(state.shape) != want):
        got = tuple(state.shape) if isinstance(state, Tensor) else type(state).__name__
        raise ValueError(f"{name}: expected None or shape {want} ({what}, W−1, C), got {got}")
