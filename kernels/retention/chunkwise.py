r"""The chunkwise form of retention (RetNet, section 2.2): the fast form for whole and packed sequences.

Time is cut into n_T tiles of C = ``tile_size`` tokens (the last one zero-padded; padding is a sequence of its
own). Position c of tile j (absolute t = jC + c, tile start t₀ = jC), S_j the state entering the tile; for one
sequence per batch row:

    o_t     = Σ_{m≤c} γ^{c−m} (q_t · k_m) v_m   +   γ^{c+1} q_t S_j                          (intra + inter)
    S_{j+1} = γ^C S_j + Σ_m γ^{C−1−m} k_mᵀ v_m                                              (the carry)

Packed sequences (``cu_seqlens``): σ(t) is the sequence of t, s_n / e_n its first / last position, L_n its
length, p = t − s_{σ(t)}, I_n its initial state; σ(t) is *fresh* in its tile when s_{σ(t)} ≥ t₀. Every decay
that would cross an offset is masked to 0:

    o_t     = Σ_{m≤c, σ(m)=σ(t)} γ^{c−m} (q_t·k_m) v_m              intra, masked to one sequence
            + [s_{σ(t)} < t₀] γ^{c+1} q_t S_j                       the carried state, only if it is σ(t)'s
            + [s_{σ(t)} ≥ t₀] γ^{p+1} q_t I_{σ(t)}                   a fresh sequence reads its own I
    S_{j+1} = [s_ε < t₀] γ^C S_j + Σ_{m: σ(m)=ε} γ^{C−1−m} k_mᵀ v_m + [s_ε ≥ t₀] γ^{t₀+C−s_ε} I_ε
                                                      (ε = σ(t₀+C−1), the sequence running at the tile's end)
    F_n     = [s_n < t_n] γ^{e_n−t_n+1} S_{j_n} + Σ_{max(t_n,s_n)≤m≤e_n} γ^{e_n−m} k_mᵀ v_m + [s_n ≥ t_n] γ^{L_n} I_n
                                                      (final states; j_n = ⌊e_n / C⌋, t_n = j_n C)

Memory: the tile scores ``(B, n_T, H, C, C)``, the per-tile states ``(B, n_T, H, Dk, Dv)`` and the fresh
sequences' windows ``(N, C, H, D)``: O(T·C + N·C·D), never ``(T, T)``. Computed in float32 (float64 for float64
inputs); ``o`` in q's dtype. How it is batched, and the custom ops that torch.compile traces as one node:
docs/design.md, "`hybrid.kernels.retention`".
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..complex_scan import complex_scan
from ..matrix_state import empty_input_result
from ..varlen import whole_rows
from .checks import (check_cu_seqlens, check_decay_values, check_qkv, check_state, check_tile_size, decay_argument,
                     state_dtype)

DEFAULT_TILE_SIZE = 64


def _decay(power: Tensor, log_decay: Tensor) -> Tensor:
    """γ^power for every head: ``power`` (…) ≥ 0 -> (…, H)."""
    return torch.exp(power.to(log_decay.dtype)[..., None] * log_decay)


def _carried(kv: Tensor, log_carry: Tensor) -> Tensor:
    """The state entering each tile, ``S_0 = 0``, ``S_{j+1} = g_j S_j + kv_j`` with ``g_j = exp(log_carry_j)`` per
    head (γ^C, or 0 where a sequence starts in the tile: −∞): kv ``(B, nT, H, Dk, Dv)``, log_carry ``(nT, H)``.

    A linear recurrence over the tiles with a real decay per head, run as the complex scan with every angle 0
    (each (Dk, Dv) state a row of Dk·Dv/2 pairs): one kernel on a GPU, instead of a Python loop of nT steps,
    which dominated a long packed row (65,536 tokens: 1,024 tiles, two launches each way and tile)."""
    B, nT, H, Dk, Dv = kv.shape
    n = Dk * Dv
    x = kv.reshape(B, nT, H, n)  # (B, nT, H, Dk, Dv) -> (B, nT, H, Dk·Dv): a state as interleaved pairs
    if n % 2:
        x = F.pad(x, (0, 1))
    P = x.shape[-1] // 2
    backend = "torch" if kv.is_cuda and kv.dtype == torch.float64 else None  # (the Triton kernels: float32)
    states, _ = complex_scan(x, log_carry[None, :, :, None].expand(1, nT, H, P), kv.new_zeros(H, P),
                             backend=backend, check_values=False)  # (B, nT, H, 2P): S_{j+1}
    states = states[..., :n].reshape(B, nT, H, Dk, Dv)
    return torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)  # (B, nT, H, Dk, Dv): S_j


def _chunkwise(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, init: Tensor | None, cu: Tensor, C: int,
               want_final: bool) -> tuple[Tensor, Tensor | None]:
    """The scheme of the module docstring. q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)``, T ≥ 1, all in the state
    dtype; cu ``(N+1,)`` long (the sequences, shared by the B rows); init ``(B, N, H, Dk, Dv)`` or None.
    Returns o ``(B, T, H, Dv)`` and, if want_final, the final states ``(B, N, H, Dk, Dv)``."""
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    N = cu.shape[0] - 1
    dev = q.device
    C = min(C, T)
    nT = -(-T // C)
    Tp = nT * C
    if Tp != T:  # pad time to whole tiles: zeros, a sequence of their own
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, Tp - T)) for x in (q, k, v))
    masked = N > 1  # one sequence per row: the padding is the only other "sequence" and it is all zeros
    t = torch.arange(Tp, device=dev)
    seg = torch.searchsorted(cu[1:].contiguous(), t, right=True)  # (Tp,): σ(t); N on the padding
    start = cu[seg]  # (Tp,): s_σ(t) (T on the padding)
    fresh = (start >= t - t % C).view(nT, C)  # (nT, C): σ(t) started inside t's tile
    c = torch.arange(C, device=dev)
    qt = q.view(B, nT, C, H, Dk)  # split time into (tile, position)
    kt = k.view(B, nT, C, H, Dk)
    vt = v.view(B, nT, C, H, Dv)

    # intra: γ^{c−m} for m ≤ c in one sequence
    diff = c[:, None] - c[None, :]  # (C, C): c − m
    intra = _decay(diff.clamp(min=0), log_decay).permute(2, 0, 1).masked_fill(diff < 0, 0.0)  # (H, C, C)
    if masked:
        segt = seg.view(nT, C)
        intra = intra * (segt[:, :, None] == segt[:, None, :])[:, None]  # (nT, H, C, C)
    scores = torch.einsum("bnchd,bnmhd->bnhcm", qt, kt) * intra  # (B, nT, H, C, C)
    o = torch.einsum("bnhcm,bnmhe->bnche", scores, vt)  # (B, nT, C, H, Dv)

    # each tile's own key-value sum: the keys of the sequence running at its end, γ^{C−1−m}
    k_decay = _decay(C - 1 - c, log_decay)  # (C, H)
    if masked:
        k_decay = k_decay * (segt == segt[:, -1:])[..., None]  # (nT, C, H)
    kv = torch.einsum("bnmhd,bnmhe->bnhde", kt * k_decay[..., None], vt)  # (B, nT, H, Dk, Dv)
    fresh_end = fresh[:, -1]  # (nT,): the sequence at the tile's end started inside it
    if init is not None:  # fresh at the tile's end: γ^{t₀+C−s} I enters the carried state
        init_ext = torch.cat([init, init.new_zeros(B, 1, H, Dk, Dv)], dim=1)  # (B, N+1, …): padding's I = 0
        seg_end = seg.view(nT, C)[:, -1]  # (nT,)
        w = _decay(C * torch.arange(1, nT + 1, device=dev) - start.view(nT, C)[:, -1], log_decay)  # (nT, H)
        kv = kv + init_ext[:, seg_end] * (w * fresh_end[:, None])[None, :, :, None, None]

    entering = _carried(kv, torch.where(fresh_end[:, None], float("-inf"), C * log_decay))  # (B, nT, H, Dk, Dv)
    q_decay = _decay(c + 1, log_decay) * ~fresh[..., None]  # (nT, C, H): γ^{c+1}, 0 for fresh sequences
    o = o + torch.einsum("bnchd,bnhde->bnche", qt * q_decay[..., None], entering)
    o = o.reshape(B, Tp, H, Dv)  # (B, nT, C, H, Dv) -> (B, Tp, H, Dv)

    s, e = cu[:-1], cu[1:] - 1  # (N,): first and last positions
    if init is not None:  # fresh sequences read their own I: a window of C queries from each start
        idx = (s[:, None] + c).clamp(max=Tp - 1)  # (N, C); entries past s's sequence or tile are never read
        q_win = q[:, idx] * _decay(c + 1, log_decay)[..., None]  # (B, N, C, H, Dk)
        win = torch.einsum("bnchd,bnhde->bnche", q_win, init)  # (B, N, C, H, Dv): γ^{p+1} q I
        win = torch.cat([win.reshape(B, N * C, H, Dv), win.new_zeros(B, 1, H, Dv)], dim=1)
        src = torch.where(fresh.reshape(Tp) & (seg < N), seg * C + (t - start), N * C)  # (Tp,): else the 0 row
        o = o + win[:, src]

    final = None
    if want_final:
        j = torch.div(e, C, rounding_mode="floor")  # (N,): the tile of each last position
        t0 = j * C
        carried = s < t0  # (N,)
        final = entering[:, j] * (_decay(e - t0 + 1, log_decay) * carried[:, None])[None, :, :, None, None]
        p = t0[:, None] + c  # (N, C): the positions of the end tile
        W = _decay((e[:, None] - p).clamp(min=0), log_decay) * ((p >= s[:, None]) & (p <= e[:, None]))[..., None]
        final = final + torch.einsum("bnchd,bnche->bnhde", kt[:, j] * W[..., None], vt[:, j])  # (B, N, H, Dk, Dv)
        if init is not None:
            final = final + init * (_decay(e - s + 1, log_decay) * ~carried[:, None])[None, :, :, None, None]
    return o[:, :T], final


def _forward(q, k, v, log_decay, initial_state, cu_seqlens, tile_size: int, output_final_state: bool):
    """Public shapes in and out: initial / final ``(N, H, Dk, Dv)`` with cu_seqlens, ``(B, H, Dk, Dv)`` without."""
    B, T, H, Dk = q.shape
    sdt = state_dtype(q.dtype)
    packed = cu_seqlens is not None
    if T == 0:  # nothing to mix: the state passes through
        return empty_input_result(q, v, initial_state, cu_seqlens, output_final_state)
    cu = cu_seqlens.to(torch.long) if packed else whole_rows(T, q.device)
    init = None
    if initial_state is not None:
        init = initial_state.to(sdt)
        init = init[None] if packed else init[:, None]  # (B, N, H, Dk, Dv)
    o, final = _chunkwise(q.to(sdt), k.to(sdt), v.to(sdt), log_decay.to(sdt), init, cu, tile_size,
                          output_final_state)
    if final is not None:
        final = final[0] if packed else final[:, 0]
    return o.to(q.dtype), final


# --- the custom op: one traced node under torch.compile ------------------------------------------------


@torch.library.custom_op("hybrid::retention_chunkwise", mutates_args=())
def _op(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, initial_state: Optional[Tensor],
        cu_seqlens: Optional[Tensor], tile_size: int, output_final_state: bool) -> tuple[Tensor, Tensor]:
    """(o, final); final is an empty ``(0,)`` tensor when not output_final_state (an op returns tensors)."""
    o, final = _forward(q, k, v, log_decay, initial_state, cu_seqlens, tile_size, output_final_state)
    final = final.contiguous() if final is not None else q.new_empty(0, dtype=state_dtype(q.dtype))
    return o.contiguous(), final  # contiguous, as the fake promises


@_op.register_fake
def _(q, k, v, log_decay, initial_state, cu_seqlens, tile_size, output_final_state):
    B, T, H, Dk = q.shape
    n = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    final_shape = (n, H, Dk, v.shape[-1]) if output_final_state else (0,)
    return q.new_empty(B, T, H, v.shape[-1]), q.new_empty(final_shape, dtype=state_dtype(q.dtype))


def _autograd_inside_op():
    """A context that turns autograd back on inside an op's body. The dispatcher runs a custom op's body with
    the autograd dispatch keys excluded (``torch.enable_grad`` alone records nothing there); this re-includes
    them, keeping everything else excluded (autocast stays off). Private torch API: None where it is
    missing, and the backward then differentiates with ``torch.func.vjp`` instead."""
    try:
        exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
        return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)
    except AttributeError:
        return None


@torch.library.custom_op("hybrid::retention_chunkwise_backward", mutates_args=())
def _op_backward(grad_o: Tensor, grad_final: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                 initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], tile_size: int,
                 needs_grad: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients w.r.t. q, k, v, log_decay, initial_state (an empty ``(0,)`` for each one not in ``needs_grad``
    and for a None initial_state): the forward recomputed under autograd and differentiated."""
    want_final = grad_final is not None
    inputs = (q, k, v, log_decay, initial_state)
    wanted = [i for i, x in enumerate(inputs) if x is not None and needs_grad[i]]
    cotangents = (grad_o, grad_final) if want_final else (grad_o,)

    def f(*leaves):  # the forward as a function of the wanted inputs
        args = list(inputs)
        for i, x in zip(wanted, leaves):
            args[i] = x
        o, final = _forward(*args, cu_seqlens, tile_size, want_final)
        return (o, final) if want_final else (o,)

    grads = [None] * len(wanted)
    guard = _autograd_inside_op()
    if not wanted:
        pass
    elif guard is None:  # pragma: no cover (a torch without the private guard)
        grads = list(torch.func.vjp(f, *(inputs[i] for i in wanted))[1](cotangents))
    else:
        with guard, torch.enable_grad():
            leaves = [inputs[i].detach().requires_grad_() for i in wanted]
            pairs = [(y, g) for y, g in zip(f(*leaves), cotangents) if y.requires_grad]  # T = 0: o is constant
            if pairs:
                grads = list(torch.autograd.grad([y for y, _ in pairs], leaves, [g for _, g in pairs],
                                                 allow_unused=True))
    out = [q.new_empty(0) for _ in inputs]  # distinct tensors: returns never alias one another
    seen = {c.untyped_storage().data_ptr() for c in cotangents}  # a gradient passed straight through (T = 0)
    for i, g in zip(wanted, grads):
        if g is None:
            g = torch.zeros_like(inputs[i], memory_format=torch.contiguous_format)
        elif g.untyped_storage().data_ptr() in seen:
            g = g.clone(memory_format=torch.contiguous_format)
        out[i] = g.contiguous()
    return tuple(out)


@_op_backward.register_fake
def _(grad_o, grad_final, q, k, v, log_decay, initial_state, cu_seqlens, tile_size, needs_grad):
    return tuple(x.new_empty(x.shape) if x is not None and need else q.new_empty(0)  # contiguous
                 for x, need in zip((q, k, v, log_decay, initial_state), needs_grad))


def _setup_context(ctx, inputs, output):
    q, k, v, log_decay, initial_state, cu_seqlens, tile_size, output_final_state = inputs
    ctx.save_for_backward(q, k, v, log_decay, initial_state, cu_seqlens)
    ctx.tile_size, ctx.output_final_state = tile_size, output_final_state


def _backward(ctx, grad_o, grad_final):
    q, k, v, log_decay, initial_state, cu_seqlens = ctx.saved_tensors
    if grad_o is None:
        grad_o = torch.zeros(q.shape[:3] + v.shape[-1:], dtype=q.dtype, device=q.device)
    grad_final = grad_final if ctx.output_final_state else None
    needs = [bool(n) for n in ctx.needs_input_grad[:5]]
    grads = torch.ops.hybrid.retention_chunkwise_backward(
        grad_o, grad_final, q, k, v, log_decay, initial_state, cu_seqlens, ctx.tile_size, needs)
    return tuple(g if need else None for g, need in zip(grads, needs)) + (None, None, None)


_op.register_autograd(_backward, setup_context=_setup_context)


# --- the public function --------------------------------------------------------------------------------


def retention_chunkwise(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None = None,
                        initial_state: Tensor | None = None, *, output_final_state: bool = False,
                        cu_seqlens: Tensor | None = None, tile_size: int = DEFAULT_TILE_SIZE,
                        log_gamma: Tensor | None = None, check_values: bool = True) -> tuple[Tensor, Tensor | None]:
    """q, k: ``(B, T, H, Dk)``; v: ``(B, T, H, Dv)``; log_decay: ``(H,)``; initial_state: ``(B, H, Dk, Dv)``, or
    ``(N, H, Dk, Dv)`` with cu_seqlens, or None (zeros); cu_seqlens: ``(N+1,)`` offsets of N sequences packed
    into a ``(1, total_T, …)`` batch (None: each row is one sequence); tile_size: the tile length C (any
    positive int; ≥ T computes the parallel form in one tile; the numbers do not depend on it).

    Returns ``o`` ``(B, T, H, Dv)`` (q's dtype) and, when output_final_state, the state after each sequence
    ``(B or N, H, Dk, Dv)`` (float32; float64 for float64 inputs), else None. The same numbers as
    ``retention_reference``. ``log_gamma``: ``log_decay``'s old name (it still works). ``check_values``: check
    ``log_decay`` finite and ≤ 0 (one device sync); the model, whose decays are so by construction, passes False.
    """
    log_decay = decay_argument(log_decay, log_gamma, "retention_chunkwise")
    check_tile_size(tile_size)
    check_qkv(q, k, v, log_decay)
    if check_values:
        check_decay_values(log_decay)
    B, T, H, Dk = q.shape
    if cu_seqlens is not None:
        cu_seqlens = check_cu_seqlens(cu_seqlens, q)  # a PackedOffsets gives its tensor, without a read back
        check_state(initial_state, "initial_state", (cu_seqlens.shape[0] - 1, H, Dk, v.shape[-1]), q,
                    "(N, H, Dk, Dv)")
    else:
        check_state(initial_state, "initial_state", (B, H, Dk, v.shape[-1]), q)
    output_final_state = bool(output_final_state)
    if not torch.compiler.is_compiling():  # eager: plain autograd through the implementation, no recompute
        return _forward(q, k, v, log_decay, initial_state, cu_seqlens, tile_size, output_final_state)
    o, final = _op(q, k, v, log_decay, initial_state, cu_seqlens, tile_size, output_final_state)
    return o, (final if output_final_state else None)
