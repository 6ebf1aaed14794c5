"""The plain form of the causal depthwise conv: an explicit loop over time, one sequence at a time.

    y[t, c] = bias[c] + Σ_{k<W} weight[c, k] · u[t + k, c],    u = [tail; x]   (tail: the W−1 inputs before x)

The ground truth for the other forms (tests run it in float64).
"""
from __future__ import annotations

import torch
from torch import Tensor


def causal_conv1d_reference(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, initial_state: Tensor | None = None, *,
    output_final_state: bool = False, cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """x `(B, T, C)` (packed: `(1, total_T, C)` with `cu_seqlens` `(N+1,)`), weight `(C, W)`, bias `(C,)`,
    initial_state `(B | N, W−1, C)` (None: zeros). Returns y `(B, T, C)` in x's dtype and, when asked for, the
    final state `(B | N, W−1, C)`: the last W−1 entries of `[tail; x]` of each sequence."""
    W = weight.shape[1]
    dt = torch.promote_types(x.dtype, weight.dtype)
    if cu_seqlens is None:
        rows = [x[b] for b in range(x.shape[0])]  # one sequence per batch row
    else:
        bounds = cu_seqlens.tolist()
        rows = [x[0, bounds[n]:bounds[n + 1]] for n in range(len(bounds) - 1)]
    ys, finals = [], []
    for n, xs in enumerate(rows):  # xs (T_n, C)
        tail = xs.new_zeros(W - 1, xs.shape[1]) if initial_state is None else initial_state[n].to(x.dtype)
        u = torch.cat([tail, xs], dim=0).to(dt)  # (W−1+T_n, C)
        for t in range(xs.shape[0]):
            acc = torch.zeros(xs.shape[1], dtype=dt, device=x.device) if bias is None else bias.to(dt)
            for k in range(W):
                acc = acc + weight[:, k].to(dt) * u[t + k]
            ys.append(acc)
        finals.append(u[u.shape[0] - (W - 1):].to(x.dtype))
    y = (torch.stack(ys) if ys else x.new_zeros(0, x.shape[2])).to(x.dtype)  # (Σ T_n, C)
    y = y.view(x.shape) if cu_seqlens is not None else y.view(x.shape[0], x.shape[1], x.shape[2])
    if not output_final_state:
        return y, None
    return y, (torch.stack(finals) if finals else x.new_zeros(0, W - 1, x.shape[2]))  # (N, W−1, C)
