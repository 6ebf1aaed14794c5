"""The plain sequential reference: one time step after another, exactly as the formula reads.

    s_t = exp(log_decay_t) · exp(−i·theta_t) · s_{t−1} + x_t,      y_t = s_t

Pair k of ``x`` is the complex number ``x[..., 2k] + i·x[..., 2k+1]``. The tests run it in float64 and
differentiate it with autograd; it is never the fast path.
"""
from __future__ import annotations

import torch


def complex_scan_reference(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    theta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential complex scan.

    Args:
        x: ``(B, T, H, D)`` real, ``D`` even, pairs interleaved.
        log_decay, theta: broadcastable to ``(B, T, H, D/2)``.
        initial_state: ``(B, H, D)`` or None (zeros).

    Returns:
        ``y`` ``(B, T, H, D)`` in x's dtype, and the final state ``(B, H, D)`` in float64 for float64 ``x``,
        float32 otherwise.
    """
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
