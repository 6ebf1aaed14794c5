"""The plain sequential reference: one time step after another, exactly as the formula reads.

    s_t = exp(log_decay_t) · exp(−i·theta_t) · s_{t−1} + x_t,      y_t = s_t

Pair k of ``x`` is the complex number ``x[..., 2k] + i·x[..., 2k+1]``. It takes the op's arguments
(``complex_scan``'s: ``initial_state``, ``output_final_state``, ``cu_seqlens``), so it is a drop-in for the op;
packed sequences run one after another, each alone (the obvious way). The tests run it in float64 and
differentiate it with autograd; it is never the fast path.
"""
from __future__ import annotations

import torch

from ..varlen import check_cu_seqlens, host_offsets


def _sequential(x: torch.Tensor, log_decay, theta, initial_state) -> tuple[torch.Tensor, torch.Tensor]:
    """Every batch row its own sequence: ``y`` ``(B, T, H, D)`` in x's dtype and the final state ``(B, H, D)``."""
    B, T, H, D = x.shape
    P = D // 2
    real = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = torch.view_as_complex(x.to(real).reshape(B, T, H, P, 2).contiguous())  # (B, T, H, P) complex
    log_decay = torch.as_tensor(log_decay, device=x.device).to(real)
    theta = torch.as_tensor(theta, device=x.device).to(real)
    a = torch.exp(torch.complex(log_decay, -theta)).expand(B, T, H, P)  # γ_t e^{−iθ_t}
    if initial_state is None:
        s = torch.zeros(B, H, P, dtype=xc.dtype, device=x.device)
    else:
        s = torch.view_as_complex(initial_state.to(real).reshape(B, H, P, 2).contiguous())
    ys = []
    for t in range(T):
        s = a[:, t] * s + xc[:, t]
        ys.append(s)
    y = torch.stack(ys, dim=1) if ys else xc.new_zeros(B, 0, H, P)
    y = torch.view_as_real(y).reshape(B, T, H, D).to(x.dtype)
    return y, torch.view_as_real(s).reshape(B, H, D)


def complex_scan_reference(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    theta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sequential complex scan, with ``complex_scan``'s arguments.

    Args:
        x: ``(B, T, H, D)`` real, ``D`` even, pairs interleaved; ``(1, total_T, H, D)`` with ``cu_seqlens``.
        log_decay, theta: broadcastable to ``(B, T, H, D/2)``.
        initial_state: ``(B, H, D)`` (``(N, H, D)`` with ``cu_seqlens``: one per sequence) or None (zeros).
        output_final_state: also return the state after the last token (of each sequence).
        cu_seqlens: None, or ``(N+1,)`` offsets of N sequences packed into x (``hybrid.kernels.varlen``); each
            runs alone from its own initial state.

    Returns:
        ``y`` ``(B, T, H, D)`` in x's dtype and, when ``output_final_state``, the final state ``(B, H, D)``
        (``(N, H, D)``) in float64 for float64 ``x``, float32 otherwise; else None.
    """
    if cu_seqlens is None:
        y, final = _sequential(x, log_decay, theta, initial_state)
        return y, (final if output_final_state else None)
    bounds = host_offsets(check_cu_seqlens(cu_seqlens, x.shape[1], x.device, batch=x.shape[0]))
    log_decay, theta = (torch.as_tensor(t, device=x.device) for t in (log_decay, theta))

    def part(t, s, e):  # the sequence's time steps of a per-token tensor ((T, H, P) or (1, T, H, P)), or the static one
        t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))  # any broadcastable shape -> 4-D (…, Td, H, P)
        return t[:, s:e] if t.shape[1] > 1 else t

    ys, finals = [], []
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        s0 = None if initial_state is None else initial_state[n: n + 1]
        y_n, final_n = _sequential(x[:, s:e], part(log_decay, s, e), part(theta, s, e), s0)
        ys.append(y_n)
        finals.append(final_n)
    return torch.cat(ys, dim=1), (torch.cat(finals, dim=0) if output_final_state else None)
