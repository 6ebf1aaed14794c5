r"""vo_gla written as the formula reads, in complex arithmetic: the ground truth for the other forms.

Per head, with ``B_t = Σ_{s≤t} log γ_s`` and ``Φ_t = Σ_{s≤t} θ_s`` (per value pair; both restart with each
sequence), value pairs as complex numbers and S⁰ the initial state (in the frame of the token before the first):

    o_t = Σ_{j≤t} e^{B_t − B_j} (q_t · k_j) e^{i(Φ_j − Φ_t)} v_j  +  e^{B_t} e^{−iΦ_t} (q_t S⁰)
    S   = e^{B_T} e^{−iΦ_T} S⁰  +  Σ_j e^{B_T − B_j} k_j ⊗ e^{i(Φ_j − Φ_T)} v_j

It builds the ``(T, T)`` decay and ``(T, T, P)`` rotation tables: O(T²) time and memory. With ``cu_seqlens`` it
runs each sequence alone (a Python loop). Tests run it in float64; models use ``vo_gla``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..varlen import host_offsets
from .checks import check_cu_seqlens, check_inputs, check_state, state_dtype


def _complex(x: Tensor) -> Tensor:
    """``(…, 2P)`` real -> ``(…, P)`` complex (pairs interleaved)."""
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())


def _real(z: Tensor) -> Tensor:
    """``(…, P)`` complex -> ``(…, 2P)`` real."""
    return torch.view_as_real(z).flatten(-2)


def _one_sequence(q, k, v, g, th, S0):
    """q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)``, g ``(B, T, H)``, th ``(B, T, H, P)``, S0 ``(B, H, Dk, Dv)`` or None,
    all in one real dtype: o ``(B, T, H, Dv)``, final ``(B, H, Dk, Dv)``."""
    T = q.shape[1]
    cum_decay, phase = g.cumsum(1), th.cumsum(1)  # (B, T, H), (B, T, H, P): B_t, Φ_t
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # [t, j]: j ≤ t
    gap = cum_decay[:, :, None] - cum_decay[:, None, :]  # (B, T, T, H): B_t − B_j
    weight = torch.where(causal[None, :, :, None], torch.exp(torch.where(causal[None, :, :, None], gap, 0.0)), 0.0)
    turn = torch.polar(torch.ones_like(phase[:, None]), phase[:, None, :] - phase[:, :, None])  # (B, T, T, H, P)
    scores = torch.einsum("bthd,bjhd->btjh", q, k) * weight  # (B, T, T, H)
    vc = _complex(v)  # (B, T, H, P)
    o = torch.einsum("btjh,btjhp,bjhp->bthp", scores.to(vc.dtype), turn, vc)  # (B, T, H, P)
    last_turn = torch.polar(torch.ones_like(phase), phase - phase[:, -1:])  # (B, T, H, P): e^{i(Φ_j − Φ_T)}
    k_weight = torch.exp(cum_decay[:, -1:] - cum_decay)  # (B, T, H): e^{B_T − B_j}
    final = torch.einsum("bjhd,bjhp->bhdp", (k * k_weight[..., None]).to(vc.dtype), last_turn * vc)  # (B, H, Dk, P)
    if S0 is not None:
        S0c = _complex(S0)  # (B, H, Dk, P)
        back = torch.polar(torch.exp(cum_decay)[..., None].expand_as(phase), -phase)  # (B, T, H, P): e^{B_t − iΦ_t}
        o = o + back * torch.einsum("bthd,bhdp->bthp", q.to(vc.dtype), S0c)
        final = final + back[:, -1, :, None, :] * S0c
    return _real(o), _real(final)


def vo_gla_reference(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, theta: Tensor,
                     initial_state: Tensor | None = None, *, output_final_state: bool = False,
                     cu_seqlens: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Same arguments and returns as ``vo_gla`` (without its ``tile_size`` and ``backend``)."""
    check_inputs(q, k, v, log_decay, theta)
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    sdt = state_dtype(q.dtype)
    g = log_decay.to(sdt).expand(B, T, H)
    th = theta.to(sdt).expand(B, T, H, Dv // 2)
    q_, k_, v_ = (x.to(sdt) for x in (q, k, v))
    S = None if initial_state is None else initial_state.to(sdt)
    if cu_seqlens is None:
        check_state(initial_state, "initial_state", (B, H, Dk, Dv), q)
        if T == 0:
            o, final = q.new_zeros(B, 0, H, Dv), (S.clone() if S is not None else q_.new_zeros(B, H, Dk, Dv))
        else:
            o, final = _one_sequence(q_, k_, v_, g, th, S)
    else:
        N = check_cu_seqlens(cu_seqlens, q)
        check_state(initial_state, "initial_state", (N, H, Dk, Dv), q, "(N, H, Dk, Dv)")
        outs, finals = [], []
        bounds = host_offsets(cu_seqlens)
        for n, (a, b) in enumerate(zip(bounds, bounds[1:])):  # each sequence alone
            o_n, f_n = _one_sequence(q_[:, a:b], k_[:, a:b], v_[:, a:b], g[:, a:b], th[:, a:b],
                                     None if S is None else S[n:n + 1])
            outs.append(o_n)
            finals.append(f_n)
        o, final = torch.cat(outs, dim=1), torch.cat(finals, dim=0)
    return o.to(q.dtype), (final if output_final_state else None)
