"""Converting between the interleaved and half rotary layouts by permuting channels.

Interleaved pairs `(2k, 2k+1)`; half pairs `(k, k + R/2)` (HF's rotate_half). Over the rotated part
(the first R channels of each head), the half layout lists the pairs' first components then their second:

    half[j] = interleaved[2j]              j < R/2
    half[j] = interleaved[2(j − R/2) + 1]  R/2 ≤ j < R          (channels ≥ R are not moved)

Permuting the rows of a q/k (or v) projection the same way makes the converted model compute the same
function: the rotation commutes with the relabelling, and q·k is unchanged when both are permuted alike.
"""
from __future__ import annotations

import torch

from hybrid.checks import check_even_dim, check_positive_int

from .apply import check_layout


def rotary_permutation(head_dim: int, rotary_dim: int | None = None, *, src: str = "interleaved",
                       dst: str = "half") -> torch.Tensor:
    """int64 `(head_dim,)` index with `x_dst = x_src[..., perm]` for one head's channels."""
    check_layout("src", src)
    check_layout("dst", dst)
    check_positive_int("head_dim", head_dim)
    R = head_dim if rotary_dim is None else check_even_dim("rotary_dim", rotary_dim, at_most=head_dim)
    perm = torch.arange(head_dim)
    if src == dst:
        return perm
    to_half = torch.cat((torch.arange(0, R, 2), torch.arange(1, R, 2)))  # (R,): half[j] = inter[to_half[j]]
    perm[:R] = to_half if dst == "half" else torch.argsort(to_half)
    return perm


def convert_layout(x: torch.Tensor, *, rotary_dim: int | None = None, src: str = "interleaved",
                   dst: str = "half") -> torch.Tensor:
    """Relabel the channels of per-head activations x `(..., head_dim)` from layout src to dst."""
    return x[..., rotary_permutation(x.shape[-1], rotary_dim, src=src, dst=dst).to(x.device)]


def convert_projection(weight: torch.Tensor, n_heads: int, *, rotary_dim: int | None = None,
                       src: str = "interleaved", dst: str = "half", dim: int = 0) -> torch.Tensor:
    """Permute a projection whose axis `dim` has `n_heads·head_dim` entries, head by head.

    dim=0: q/k/v projection weights `(n_heads·head_dim, d_in)` and their biases `(n_heads·head_dim,)`.
    dim=1: the output projection `(d_model, n_heads·head_dim)` (needed when v/o are rotated, VO-RoPE).
    Converting src→dst then dst→src is the identity.
    """
    check_positive_int("n_heads", n_heads)
    if not -weight.dim() <= dim < weight.dim():
        raise ValueError(f"dim: expected an axis of weight with shape {tuple(weight.shape)}, got {dim}")
    n = weight.shape[dim]
    if n % n_heads:
        raise ValueError(f"weight: expected axis {dim} of size n_heads·head_dim with n_heads={n_heads}, got size {n}")
    head_dim = n // n_heads
    perm = rotary_permutation(head_dim, rotary_dim, src=src, dst=dst)
    index = (torch.arange(n_heads)[:, None] * head_dim + perm[None, :]).flatten()  # (n_heads·head_dim,)
    return weight.index_select(dim, index.to(weight.device))
