"""The "torch" backend: a blocked complex scan in plain PyTorch, forward and backward.

The recurrence ``out_t = a_t · out_{t∓1} + x_t`` (``a_t = exp(z_t)``, ``z_t = log γ_t − iθ_t``) is split
into ``N`` blocks of ``C`` steps:

1. every block is scanned from a zero state, all blocks at once (``C`` vectorised steps);
2. the block end states are carried across blocks (``N`` small steps): ``s_{n+1} = A_n s_n + local_end_n``,
   where ``A_n`` is the block's total decay;
3. each block is corrected in one pass: ``out_c += (Π_{c'≤c} a_{c'}) · s_n``.

The cumulative decays are running products of the per-step decays (|a| ≤ 1), so nothing overflows,
whatever the decay; no inverse decays are ever formed. Time-varying decays take one buffer of the input's
size; time-invariant ones only ``C`` powers. Cost: ``C + N`` Python-level steps instead of ``T``, and a few
passes over the data; memory is ``O(B·T·H·P)`` like the output. The backward is the same scan run in reverse
(see docs/design.md):

    λ_t = g_t + conj(a_{t+1}) λ_{t+1},   ∂x_t = λ_t,   g_z = λ_t · conj(a_t · s_{t−1}),
    ∂log γ_t = Re g_z,   ∂θ_t = −Im g_z,   ∂s_0 = conj(a_1) λ_1.

``torch_forward`` / ``torch_backward`` are what the custom op of ``ops.py`` runs; ``TorchComplexScan`` wraps the
same two for direct callers. ``log γ = −∞`` gives ``a_t = 0`` exactly, and so every running product through it
(the packed-sequence restart of ``interface.py``).
"""
from __future__ import annotations

import math

import torch


def default_block_size(T: int) -> int:
    """Balance the two Python loops (C steps within blocks, T/C across them): C ≈ √T, a multiple of 8, at
    most 64 (the steps within a block are the costlier ones)."""
    return max(8, min(64, 8 * round(math.sqrt(max(T, 1)) / 8)))


def empty_buffer(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every buffer the backend writes comes from here, so tests can poison them (fill with NaN)."""
    return torch.empty(*shape, dtype=dtype, device=device)


def _decay(log_decay: torch.Tensor, angle: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``exp(log_decay) · e^{i·angle}`` from real exp / cos / sin (vectorised; ``torch.polar`` is not on CPU)."""
    magnitude = torch.exp(log_decay)
    return torch.complex(magnitude * torch.cos(angle), magnitude * torch.sin(angle), out=out)


def _static_cumulative_decay(z: torch.Tensor, C: int, reverse: bool) -> torch.Tensor:
    """``a^k`` for the time-invariant case: ``k = c + 1`` (forward) or ``C − c`` (reverse).

    z: ``(Bd, H, P)`` complex log-decay. Returns ``(Bd, 1, C, H, P)``.
    """
    k = torch.arange(1, C + 1, device=z.device, dtype=z.real.dtype)
    if reverse:
        k = k.flip(0)
    # the angle wrapped into [−π, π) first, in float64 (θ as given: exact), so that k·θ does not carry k times the
    # rounding of a large θ (|θ|·k·2⁻²⁴ in float32); an angle already there is unchanged
    wrapped = torch.remainder(z.imag.double() + math.pi, 2 * math.pi) - math.pi
    z = torch.complex(z.real, wrapped.to(z.real.dtype))
    return torch.exp(z.unsqueeze(1).unsqueeze(2) * k.view(1, 1, C, 1, 1))


def blocked_scan(
    log_decay: torch.Tensor,
    angle: torch.Tensor,
    x: torch.Tensor,
    s0: torch.Tensor | None,
    out: torch.Tensor,
    block_size: int,
    reverse: bool = False,
) -> torch.Tensor:
    """``out_t = a_t · out_prev + x_t``, ``a_t = exp(log_decay_t + i·angle_t)``, ``out_prev`` the value at
    t−1 (t+1 when ``reverse``).

    Args:
        log_decay, angle: real ``(Bd, Td, H, P)``, ``Bd ∈ {1, B}``, ``Td ∈ {1, T}`` (1 = time-invariant).
        x: complex ``(B, T, H, P)`` (any strides along T).
        s0: complex ``(B, H, P)``, the value before the first step (after the last, when ``reverse``), or None.
        out: complex ``(B, T, H, P)``, written in full.
    Returns:
        the last value produced (the state after position T−1, or before position 0 when ``reverse``).
    """
    B, T, H, P = x.shape
    static = log_decay.shape[1] == 1 and angle.shape[1] == 1
    if not static:  # one of them varies in time: view the other over time too (no copy)
        log_decay = log_decay.expand(-1, T, -1, -1)
        angle = angle.expand(-1, T, -1, -1)
    Bd = max(log_decay.shape[0], angle.shape[0])
    C = max(1, min(block_size, T))
    N = T // C
    r = T - N * C
    full = slice(r, T) if reverse else slice(0, N * C)
    tail = range(r - 1, -1, -1) if reverse else range(N * C, T)
    a_static = _decay(log_decay[:, 0], angle[:, 0]) if static else None  # (Bd, H, P)
    s = s0 if s0 is not None else x.new_zeros(B, H, P)

    if N > 0:
        xv = x[:, full].view(B, N, C, H, P)  # split time into (block, position)
        ov = out[:, full].view(B, N, C, H, P)
        order = range(C - 1, -1, -1) if reverse else range(C)
        step = 1 if reverse else -1  # offset of the previous position in iteration order
        first, last = order[0], order[-1]
        if static:
            a_static_b = a_static.unsqueeze(1)  # (Bd, 1, H, P)
            a_at = lambda c: a_static_b  # noqa: E731
        else:  # `cum` holds each position's decay, then (in place) the running product within its block
            ldv = log_decay[:, full].view(log_decay.shape[0], N, C, H, P)
            angv = angle[:, full].view(angle.shape[0], N, C, H, P)
            cum = empty_buffer(Bd, N, C, H, P, dtype=x.dtype, device=x.device)
            a_at = lambda c: cum[:, :, c]  # noqa: E731
            _decay(ldv[:, :, first], angv[:, :, first], out=cum[:, :, first])
        # 1. every block from a zero state, all blocks at once
        ov[:, :, first].copy_(xv[:, :, first])
        for c in order[1:]:
            if not static:
                _decay(ldv[:, :, c], angv[:, :, c], out=cum[:, :, c])
            torch.addcmul(xv[:, :, c], a_at(c), ov[:, :, c + step], out=ov[:, :, c])
            if not static:
                cum[:, :, c].mul_(cum[:, :, c + step])
        if static:
            z = torch.complex(*torch.broadcast_tensors(log_decay[:, 0], angle[:, 0]))  # (Bd, H, P)
            cum = _static_cumulative_decay(z, C, reverse)  # (Bd, 1, C, H, P)
        # 2. carry the block end states across blocks
        carried = empty_buffer(B, N, H, P, dtype=x.dtype, device=x.device)
        for n in range(N - 1, -1, -1) if reverse else range(N):
            carried[:, n] = s
            s = torch.addcmul(ov[:, n, last], cum[:, min(n, cum.shape[1] - 1), last], s)
        # 3. correct every position by its cumulative decay times the carried-in state
        ov.addcmul_(cum, carried.unsqueeze(2))

    for t in tail:
        a_t = a_static if static else _decay(log_decay[:, t], angle[:, t])
        s = torch.addcmul(x[:, t], a_t, s)
        out[:, t] = s
    return s


def torch_forward(x, log_decay, theta, initial_state, block_size):
    """The blocked scan on normalised inputs. Returns ``y`` ``(B, T, H, D)`` in x's dtype, the final state
    ``(B, H, D)`` and the states ``(B, T, H, D)`` in the state dtype that the backward needs: ``y`` itself when
    x is in the state dtype (returned as None then), else the float32 states before rounding to x's dtype."""
    B, T, H, D = x.shape
    P = D // 2
    real = log_decay.dtype  # the state dtype: float32 (float64 for float64 x)
    xr = x if x.dtype == real else x.to(real)
    xc = torch.view_as_complex(xr.view(B, T, H, P, 2))  # (B, T, H, P) complex
    s0 = None if initial_state is None else torch.view_as_complex(initial_state.view(B, H, P, 2))
    yc = empty_buffer(B, T, H, P, dtype=xc.dtype, device=x.device)
    final = blocked_scan(log_decay, -theta, xc, s0, yc, block_size)
    y_real = torch.view_as_real(yc).view(B, T, H, D)  # (B, T, H, P, 2) -> (B, T, H, D)
    final = torch.view_as_real(final).reshape(B, H, D).clone()  # (B, H, P, 2) -> (B, H, D)
    if x.dtype == real:
        return y_real, final, None
    return y_real.to(x.dtype), final, y_real


def torch_backward(grad_y, grad_final, log_decay, theta, states, initial_state, block_size, x_dtype, needs):
    """Gradients ``(dx, dlog_decay, dtheta, dinitial_state)`` (None where ``needs`` is False) from the upstream
    gradients (either may be None) and the forward's ``states`` ``(B, T, H, D)`` in the state dtype;
    ``dlog_decay`` / ``dtheta`` in the shapes of ``log_decay`` / ``theta``, none a view of another."""
    B, T, H, D = states.shape
    P = D // 2
    real = log_decay.dtype
    device = states.device
    cdtype = torch.complex128 if real == torch.float64 else torch.complex64
    lam = empty_buffer(B, T, H, P, dtype=cdtype, device=device)
    if grad_y is None:
        gc = torch.zeros(B, T, H, P, dtype=cdtype, device=device)
    else:
        gc = torch.view_as_complex(grad_y.to(real).contiguous().view(B, T, H, P, 2))  # (B, T, H, P) complex
    lam[:, T - 1] = gc[:, T - 1]
    if grad_final is not None:
        lam[:, T - 1] += torch.view_as_complex(grad_final.to(real).contiguous().view(B, H, P, 2))
    if T > 1:  # λ_t = g_t + conj(a_{t+1}) λ_{t+1}: the decay of t+1 aligned at t
        ld_next = log_decay if log_decay.shape[1] == 1 else log_decay[:, 1:]
        th_next = theta if theta.shape[1] == 1 else theta[:, 1:]
        blocked_scan(ld_next, th_next, gc[:, : T - 1], lam[:, T - 1], lam[:, : T - 1], block_size, reverse=True)

    need_x, need_ld, need_th, need_s0 = needs
    grad_x = grad_ld = grad_th = grad_s0 = None
    if need_x:
        grad_x = torch.view_as_real(lam).view(B, T, H, D).to(x_dtype)  # (B, T, H, P, 2) -> (B, T, H, D)
    if need_ld or need_th:
        yc = torch.view_as_complex(states.view(B, T, H, P, 2))  # (B, T, H, P) complex
        # conj(g_z) = conj(λ_t) · a_t · s_{t−1}: its real part is ∂log γ_t, its imaginary part ∂θ_t.
        # Formed from the product a_t·s_{t−1}, never from s_t − x_t, which cancels when the decay is strong.
        gz_conj = empty_buffer(B, T, H, P, dtype=cdtype, device=device)
        if initial_state is not None:
            gz_conj[:, 0] = torch.view_as_complex(initial_state.view(B, H, P, 2))
        else:
            gz_conj[:, 0] = 0
        gz_conj[:, 1:] = yc[:, : T - 1]  # s_{t−1}
        # conj_physical, not the lazy conj() view: inside a graph compiled by AOTAutograd (the custom op of
        # ops.py) the view's conjugate bit was dropped and the gradients came out wrong.
        gz_conj.mul_(_decay(log_decay, -theta)).mul_(lam.conj_physical())  # (B, T, H, P)
        if need_ld:
            grad_ld = _reduce_to(gz_conj.real, log_decay.shape)
        if need_th:
            grad_th = _reduce_to(gz_conj.imag, theta.shape)
    if need_s0 and initial_state is not None:
        a_first = _decay(log_decay[:, 0], theta[:, 0])  # conj(a_1), (Bd, H, P)
        grad_s0 = torch.view_as_real(a_first * lam[:, 0]).reshape(B, H, D)  # (B, H, P, 2) -> (B, H, D)
    return grad_x, grad_ld, grad_th, grad_s0


def _reduce_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``g`` ``(B, T, H, P)`` (a strided view of a complex buffer) summed over the axes that ``shape``
    broadcasts; always a fresh contiguous tensor (``contiguous()`` would return an empty view itself, and a custom
    op may not return two views of one buffer)."""
    dims = tuple(d for d in (0, 1) if shape[d] == 1)
    return g.sum(dims, keepdim=True) if dims else g.clone(memory_format=torch.contiguous_format)


class TorchComplexScan(torch.autograd.Function):
    """Autograd wrapper of the blocked scan; inputs normalised as in ``checks.py``. (The public
    ``complex_scan`` goes through the ``hybrid::complex_scan`` custom op of ``ops.py`` instead, which calls the
    same two functions.)"""

    @staticmethod
    def forward(ctx, x, log_decay, theta, initial_state, block_size):
        y, final, states = torch_forward(x, log_decay, theta, initial_state, block_size)
        ctx.block_size = block_size
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(log_decay, theta, y if states is None else states, initial_state)
        return y, final

    @staticmethod
    def backward(ctx, grad_y, grad_final):
        log_decay, theta, states, initial_state = ctx.saved_tensors
        grads = torch_backward(grad_y, grad_final, log_decay, theta, states, initial_state, ctx.block_size,
                               ctx.x_dtype, ctx.needs_input_grad[:4])
        return (*grads, None)


def complex_scan_torch(x, log_decay, theta, initial_state, block_size=None):
    """Blocked-scan backend on normalised inputs; returns ``(y, final_state)``."""
    block = block_size if block_size is not None else default_block_size(x.shape[1])
    return TorchComplexScan.apply(x, log_decay, theta, initial_state, block)
