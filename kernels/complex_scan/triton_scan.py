"""Triton backend of the complex diagonal scan. Per rotary pair ``k`` (``x[..., 2k] + i·x[..., 2k+1]``):

    forward   s_t = a_t · s_{t−1} + x_t,   a_t = exp(log_decay_t − i·theta_t),   y_t = s_t,   s_0 = initial_state
    backward  λ_t = g_t + conj(a_{t+1}) λ_{t+1}   (plus ∂L/∂final at the last step),   ∂L/∂x_t = λ_t,
              g_z = λ_t · conj(a_t s_{t−1}),   ∂L/∂log_decay_t = Re g_z,   ∂L/∂theta_t = −Im g_z,
              ∂L/∂initial_state = conj(a_1) λ_1

with ``g_t = ∂L/∂Re y_t + i ∂L/∂Im y_t``. Shapes: ``x`` ``(B, T, H, D)`` (float32 / bfloat16 / float16,
``P = D/2`` pairs interleaved); ``log_decay``, ``theta`` float32 ``(Bd, Td, H, P)``, ``Bd ∈ {1, B}``,
``Td ∈ {1, T}``; states ``(B, H, D)`` float32. Grid ``(B·H, ⌈P/BP⌉)``, each program walking time in tiles of
``BT`` steps; the forward saves the float32 state entering each tile, ``(B, H, ⌈T/BT⌉, D)``, from which the
backward recomputes the states. Arithmetic is float32 whatever x's dtype. ``log_decay = −∞`` gives ``a = 0``
exactly (a sequence restart).

``triton_forward`` / ``triton_backward`` are what the custom op of ``ops.py`` runs: the one autograd path of the
Triton scan. ``forced_blocks`` forces its tiles (tests of tile edges, tuning). Knobs: ``$HYBRID_SCAN_AUTOTUNE``, ``$HYBRID_SCAN_SHIFT``
(``hybrid.kernels.env``). The kernel layout, the backward's recompute and the tuning: docs/design.md,
"The Triton scan".
"""
from __future__ import annotations

import contextlib
import inspect
import os

import torch
import triton
import triton.language as tl

from ..env import read_env

__all__ = ["triton_forward", "triton_backward", "forced_blocks"]

# Decided once, when this module is imported (that is also when ``triton.jit`` decides).
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


# ----------------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def _affine_combine(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2):
    """Compose ``s ↦ a1·s + b1`` followed by ``s ↦ a2·s + b2`` (complex): ``(a2·a1, a2·b1 + b2)``."""
    ar = ar2 * ar1 - ai2 * ai1
    ai = ar2 * ai1 + ai2 * ar1
    br = ar2 * br1 - ai2 * bi1 + br2
    bi = ar2 * bi1 + ai2 * br1 + bi2
    return ar, ai, br, bi


@triton.jit
def _affine_combine_excl(ar1, ai1, br1, bi1, er1, ei1, ar2, ai2, br2, bi2, er2, ei2):
    """``_affine_combine`` that also carries ``e = b − x_last`` (the state just before the segment's last
    input is added, times that step's ``a``): ``e = a2·b1 + e2``. A single step has ``e = 0``.

    The backward needs ``a_t·s_{t−1}``; forming it as ``s_t − x_t`` would cancel catastrophically when the
    decay is strong (``a_t·s_{t−1}`` ≪ ``x_t``), this way it costs two additions per combine instead.
    """
    ar = ar2 * ar1 - ai2 * ai1
    ai = ar2 * ai1 + ai2 * ar1
    pr = ar2 * br1 - ai2 * bi1
    pi = ar2 * bi1 + ai2 * br1
    return ar, ai, pr + br2, pi + bi2, pr + er2, pi + ei2


@triton.jit
def _sincos(th):
    """``(sin th, cos th)`` in float32.

    sin and cos share one range reduction (the two libdevice calls reduce twice, ~2x the instructions):
    ``th = k·π/2 + r`` with ``|r| <= π/4`` by a three-term Cody–Waite split of π/2 applied with fused
    multiply-adds (error ~ulp(r) while ``k`` is an exact fp32 integer: ``|th| < 2^24·π/2 ≈ 2.6e7`` rad; an
    fp32 angle that large has an ulp of 2 rad and means nothing anyway), then Taylor polynomials whose
    truncation error on ``|r| <= π/4`` is below 2e-9 (sin, to r^9) and 2e-10 (cos, to r^10), and the
    quadrant ``k mod 4`` picks and signs the pair. Within ~1 ulp of float64 (tests/kernels).
    """
    k = tl.floor(th * 0.6366197723675814 + 0.5)  # nearest integer to th / (π/2)
    r = tl.fma(k, -1.5707963705062866, th)  # π/2 = 1.5707963705062866 − 4.37e-8 − 1.72e-15 (fp32 parts)
    r = tl.fma(k, 4.371138828673793e-08, r)
    r = tl.fma(k, 1.7151245100058819e-15, r)
    # A no-op for |th| < 2.6e7 (|r| <= π/4 there). Beyond, the reduction leaves |r| large (k is no longer
    # exact) and the polynomials would overflow to inf / NaN: clamped, sin / cos stay finite and at most ~1
    # in magnitude, so a meaningless angle (say a gate at a padding token) never makes the state non-finite,
    # and a sequence restart (a = 0) still clears it exactly.
    r = tl.minimum(tl.maximum(r, -1.0), 1.0)
    z = r * r
    ps = tl.fma(z, 2.7557319223985893e-06, -1.9841269841269841e-04)  # 1/9!, −1/7!
    ps = tl.fma(ps, z, 8.3333333333333333e-03)  # 1/5!
    ps = tl.fma(ps, z, -1.6666666666666667e-01)  # −1/3!
    sin_r = tl.fma(r * z, ps, r)
    pc = tl.fma(z, -2.7557319223985891e-07, 2.4801587301587302e-05)  # −1/10!, 1/8!
    pc = tl.fma(pc, z, -1.3888888888888889e-03)  # −1/6!
    pc = tl.fma(pc, z, 4.1666666666666667e-02)  # 1/4!
    pc = tl.fma(pc, z, -0.5)
    cos_r = tl.fma(pc, z, 1.0)
    q = k.to(tl.int32)  # quadrant (two's complement keeps k mod 4 right for negative k)
    swap = (q & 1) != 0
    s = tl.where(swap, cos_r, sin_r)
    c = tl.where(swap, sin_r, cos_r)
    s = tl.where((q & 2) != 0, -s, s)
    c = tl.where(((q + 1) & 2) != 0, -c, c)
    return s, c



@triton.jit
def complex_decay(ld, th):
    """``a = exp(ld − i·th)`` as (real, imaginary) = ``(e^ld·cos th, −e^ld·sin th)``."""
    sn, cs = _sincos(th)
    m = tl.exp(ld)
    return m * cs, -(m * sn)


@triton.jit
def _tile_decay(ld_ptrs, th_ptrs, mask2, rows, mag_row, sn_row, cs_row,
                LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr):
    """``a`` over a (BT, BP) tile when at most one of decay / angle is static (the static one's exp or
    sin/cos comes precomputed per pair). Rows outside ``rows`` (padding steps) get the identity ``a = 1``.
    """
    if TH_STATIC:
        sn = sn_row[None, :]
        cs = cs_row[None, :]
    else:
        sn, cs = _sincos(tl.load(th_ptrs, mask=mask2, other=0.0))
    if LD_STATIC:
        mag = mag_row[None, :]
    else:
        mag = tl.exp(tl.load(ld_ptrs, mask=mask2, other=0.0))
    ar = mag * cs
    ai = -(mag * sn)
    if LD_STATIC or TH_STATIC:  # (both time-varying: the masked loads already give ld = th = 0)
        ar = tl.where(rows, ar, 1.0)
        ai = tl.where(rows, ai, 0.0)
    return ar, ai


@triton.jit
def _static_rows(ld_base, th_base, offs_p, mask_p, BP: tl.constexpr, LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr):
    """|a|, sin θ, cos θ and a = |a|·e^{−iθ} of a time-invariant decay / angle, (BP,) each (zeros if varying)."""
    mag_row = tl.zeros((BP,), dtype=tl.float32)
    sn_row = tl.zeros((BP,), dtype=tl.float32)
    cs_row = tl.zeros((BP,), dtype=tl.float32)
    if LD_STATIC:
        mag_row = tl.exp(tl.load(ld_base + offs_p, mask=mask_p, other=0.0))
    if TH_STATIC:
        sn_row, cs_row = _sincos(tl.load(th_base + offs_p, mask=mask_p, other=0.0))
    return mag_row, sn_row, cs_row, mag_row * cs_row, -(mag_row * sn_row)


# ----------------------------------------------------------------------------------------------------------
# Forward kernel
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def _scan_fwd_kernel(
    x_ptr, y_ptr, ld_ptr, th_ptr, h0_ptr, hT_ptr, ck_ptr,
    T, H, P, NCK,
    ld_sb, ld_st, th_sb, th_st,
    T_BUCKET,  # only an autotune key (T rounded up to a power of two)
    BT: tl.constexpr, BP: tl.constexpr,
    LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr,
    HAS_H0: tl.constexpr, SAVE_CK: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # B·H on the first grid axis (the one without the 65535 limit)
    pid_p = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    b64 = b.to(tl.int64)
    bh64 = pid_bh.to(tl.int64)
    D = 2 * P

    offs_t = tl.arange(0, BT)
    offs_p = pid_p * BP + tl.arange(0, BP)
    offs_d = pid_p * (2 * BP) + tl.arange(0, 2 * BP)
    mask_p = offs_p < P
    mask_d = offs_d < D
    is_last = (offs_t == BT - 1)[:, None]

    # Tile-relative offsets (small, int32); tile bases are int64.
    x_tile = offs_t[:, None] * (H * D) + offs_d[None, :]
    ld_tile = offs_t[:, None] * ld_st + offs_p[None, :]
    th_tile = offs_t[:, None] * th_st + offs_p[None, :]
    x_base = x_ptr + (b64 * T * H + h) * D
    y_base = y_ptr + (b64 * T * H + h) * D
    ld_base = ld_ptr + b64 * ld_sb + h * P
    th_base = th_ptr + b64 * th_sb + h * P

    # Static (time-broadcast) decay / angle: exp and sin/cos once per program.
    mag_row, sn_row, cs_row, ar_row, ai_row = _static_rows(ld_base, th_base, offs_p, mask_p, BP, LD_STATIC, TH_STATIC)

    if HAS_H0:
        h0 = tl.load(h0_ptr + bh64 * D + offs_d, mask=mask_d, other=0.0)
        cr, ci = tl.split(tl.reshape(h0, (BP, 2)))
    else:
        cr = tl.zeros((BP,), dtype=tl.float32)
        ci = tl.zeros((BP,), dtype=tl.float32)

    NT = tl.cdiv(T, BT)
    for k in range(0, NT):
        t0 = k * BT
        mask_t = (t0 + offs_t) < T
        m2 = mask_t[:, None] & mask_p[None, :]
        t0_64 = t0.to(tl.int64)

        if SAVE_CK:  # state entering this tile
            tl.store(ck_ptr + (bh64 * NCK + k) * D + offs_d, tl.reshape(tl.join(cr, ci), (2 * BP,)), mask=mask_d)

        xv = tl.load(x_base + t0_64 * (H * D) + x_tile, mask=mask_t[:, None] & mask_d[None, :], other=0.0)
        xr, xi = tl.split(tl.reshape(xv.to(tl.float32), (BT, BP, 2)))

        # a_t; padding steps (t >= T) get a = 1.
        if LD_STATIC and TH_STATIC:
            ar = tl.where(mask_t[:, None], ar_row[None, :], 1.0)
            ai = tl.where(mask_t[:, None], ai_row[None, :], 0.0)
        else:
            ar, ai = _tile_decay(ld_base + t0_64 * ld_st + ld_tile, th_base + t0_64 * th_st + th_tile, m2,
                                 mask_t[:, None], mag_row, sn_row, cs_row, LD_STATIC, TH_STATIC)

        Ar, Ai, Br, Bi = tl.associative_scan((ar, ai, xr, xi), axis=0, combine_fn=_affine_combine)
        sr = Ar * cr[None, :] - Ai * ci[None, :] + Br
        si = Ar * ci[None, :] + Ai * cr[None, :] + Bi

        yv = tl.reshape(tl.join(sr, si), (BT, 2 * BP)).to(y_ptr.dtype.element_ty)
        tl.store(y_base + t0_64 * (H * D) + x_tile, yv, mask=mask_t[:, None] & mask_d[None, :])

        cr = tl.sum(tl.where(is_last, sr, 0.0), axis=0)
        ci = tl.sum(tl.where(is_last, si, 0.0), axis=0)

    tl.store(hT_ptr + bh64 * D + offs_d, tl.reshape(tl.join(cr, ci), (2 * BP,)), mask=mask_d)


# ----------------------------------------------------------------------------------------------------------
# Backward kernel
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def _scan_bwd_kernel(
    x_ptr, dy_ptr, ld_ptr, th_ptr, ck_ptr, dhT_ptr,
    dx_ptr, dld_ptr, dth_ptr, dh0_ptr,
    T, H, P, NCK,
    ld_sb, ld_st, th_sb, th_st,
    dld_sb, dld_st, dth_sb, dth_st,
    T_BUCKET,  # only an autotune key
    BT: tl.constexpr, CK_BT: tl.constexpr, BP: tl.constexpr,
    LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr,
    HAS_DY: tl.constexpr, HAS_DHT: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DLD: tl.constexpr, NEED_DTH: tl.constexpr, NEED_DH0: tl.constexpr,
    SHIFT_GATHER: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # B·H on the first grid axis (the one without the 65535 limit)
    pid_p = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    b64 = b.to(tl.int64)
    bh64 = pid_bh.to(tl.int64)
    D = 2 * P

    offs_t = tl.arange(0, BT)
    offs_p = pid_p * BP + tl.arange(0, BP)
    offs_d = pid_p * (2 * BP) + tl.arange(0, 2 * BP)
    mask_p = offs_p < P
    mask_d = offs_d < D
    is_first = (offs_t == 0)[:, None]

    x_tile = offs_t[:, None] * (H * D) + offs_d[None, :]
    ld_tile = offs_t[:, None] * ld_st + offs_p[None, :]
    th_tile = offs_t[:, None] * th_st + offs_p[None, :]
    dld_tile = offs_t[:, None] * dld_st + offs_p[None, :]
    dth_tile = offs_t[:, None] * dth_st + offs_p[None, :]
    x_base = x_ptr + (b64 * T * H + h) * D
    dy_base = dy_ptr + (b64 * T * H + h) * D
    dx_base = dx_ptr + (b64 * T * H + h) * D
    ld_base = ld_ptr + b64 * ld_sb + h * P
    th_base = th_ptr + b64 * th_sb + h * P
    dld_base = dld_ptr + b64 * dld_sb + h * P
    dth_base = dth_ptr + b64 * dth_sb + h * P

    # Static (time-broadcast) decay / angle: exp and sin/cos once per program.
    mag_row, sn_row, cs_row, ar_row, ai_row = _static_rows(ld_base, th_base, offs_p, mask_p, BP, LD_STATIC, TH_STATIC)

    # mu: the adjoint arriving at the last step of the current tile from the steps after it.
    if HAS_DHT:
        dhT = tl.load(dhT_ptr + bh64 * D + offs_d, mask=mask_d, other=0.0)
        mur, mui = tl.split(tl.reshape(dhT, (BP, 2)))
    else:
        mur = tl.zeros((BP,), dtype=tl.float32)
        mui = tl.zeros((BP,), dtype=tl.float32)
    acc_ld = tl.zeros((BP,), dtype=tl.float32)
    acc_th = tl.zeros((BP,), dtype=tl.float32)

    NT = tl.cdiv(T, BT)
    for kk in range(0, NT):
        k = NT - 1 - kk
        t0 = k * BT
        t = t0 + offs_t
        mask_t = t < T
        m2 = mask_t[:, None] & mask_p[None, :]
        md2 = mask_t[:, None] & mask_d[None, :]
        t0_64 = t0.to(tl.int64)
        # Rows whose successor lies in this tile and in the sequence; the others use the identity.
        mask_s = ((t + 1) < T) & (offs_t < BT - 1)
        ms2 = mask_s[:, None] & mask_p[None, :]

        # a_t (this step) and c_t = conj(a_{t+1}) (successor step).
        if LD_STATIC and TH_STATIC:
            ar = tl.where(mask_t[:, None], ar_row[None, :], 1.0)
            ai = tl.where(mask_t[:, None], ai_row[None, :], 0.0)
            cr_ = tl.where(mask_s[:, None], ar_row[None, :], 1.0)
            ci_ = tl.where(mask_s[:, None], -ai_row[None, :], 0.0)
        else:
            ar, ai = _tile_decay(ld_base + t0_64 * ld_st + ld_tile, th_base + t0_64 * th_st + th_tile, m2,
                                 mask_t[:, None], mag_row, sn_row, cs_row, LD_STATIC, TH_STATIC)
            if SHIFT_GATHER:
                # a_{t+1} is the next row of the same tile: move it in registers / shared memory.
                nxt = tl.broadcast_to(tl.minimum(offs_t + 1, BT - 1)[:, None], (BT, BP))
                cr_ = tl.where(mask_s[:, None], tl.gather(ar, nxt, axis=0), 1.0)
                ci_ = tl.where(mask_s[:, None], -tl.gather(ai, nxt, axis=0), 0.0)
            else:
                # Fallback (Triton without tl.gather): the tile loaded again one step later (cache hits)
                # with its exp/sin/cos evaluated again.
                an_r, an_i = _tile_decay(ld_base + (t0_64 + 1) * ld_st + ld_tile,
                                         th_base + (t0_64 + 1) * th_st + th_tile, ms2,
                                         mask_s[:, None], mag_row, sn_row, cs_row, LD_STATIC, TH_STATIC)
                cr_ = an_r
                ci_ = -an_i

        if HAS_DY:
            g = tl.load(dy_base + t0_64 * (H * D) + x_tile, mask=md2, other=0.0)
            gr, gi = tl.split(tl.reshape(g.to(tl.float32), (BT, BP, 2)))
        else:
            gr = tl.zeros((BT, BP), dtype=tl.float32)
            gi = tl.zeros((BT, BP), dtype=tl.float32)

        # lambda_t = C_t · mu + G_t, with (C_t, G_t) the composite of the maps of steps t..end of tile.
        Cr, Ci, Gr, Gi = tl.associative_scan((cr_, ci_, gr, gi), axis=0, combine_fn=_affine_combine,
                                             reverse=True)
        lr = Cr * mur[None, :] - Ci * mui[None, :] + Gr
        li = Cr * mui[None, :] + Ci * mur[None, :] + Gi

        if NEED_DX:
            dxv = tl.reshape(tl.join(lr, li), (BT, 2 * BP)).to(dx_ptr.dtype.element_ty)
            tl.store(dx_base + t0_64 * (H * D) + x_tile, dxv, mask=md2)

        if NEED_DLD or NEED_DTH:
            # Recompute the forward states of this tile from the checkpoint.
            # (the forward saved the state entering each of its CK_BT-step tiles; BT is a multiple of CK_BT)
            ck = tl.load(ck_ptr + (bh64 * NCK + k * (BT // CK_BT)) * D + offs_d, mask=mask_d, other=0.0)
            s0r, s0i = tl.split(tl.reshape(ck, (BP, 2)))
            xv = tl.load(x_base + t0_64 * (H * D) + x_tile, mask=md2, other=0.0)
            xr, xi = tl.split(tl.reshape(xv.to(tl.float32), (BT, BP, 2)))
            zero = tl.zeros((BT, BP), dtype=tl.float32)
            Ar, Ai, _, _, Er, Ei = tl.associative_scan((ar, ai, xr, xi, zero, zero), axis=0,
                                                       combine_fn=_affine_combine_excl)
            # q_t = a_t·s_{t−1} = A_t·s0 + E_t  (no cancellation against x_t)
            qr = Ar * s0r[None, :] - Ai * s0i[None, :] + Er
            qi = Ar * s0i[None, :] + Ai * s0r[None, :] + Ei
            # g_z = lambda · conj(q)
            gzr = lr * qr + li * qi
            gzi = li * qr - lr * qi
            if NEED_DLD:
                if LD_STATIC:
                    acc_ld += tl.sum(tl.where(mask_t[:, None], gzr, 0.0), axis=0)
                else:
                    tl.store(dld_base + t0_64 * dld_st + dld_tile, gzr, mask=m2)
            if NEED_DTH:
                if TH_STATIC:
                    acc_th -= tl.sum(tl.where(mask_t[:, None], gzi, 0.0), axis=0)
                else:
                    tl.store(dth_base + t0_64 * dth_st + dth_tile, -gzi, mask=m2)

        # Carry to the previous tile: conj(a_{t0}) · lambda_{t0}.
        l0r = tl.sum(tl.where(is_first, lr, 0.0), axis=0)
        l0i = tl.sum(tl.where(is_first, li, 0.0), axis=0)
        if LD_STATIC and TH_STATIC:
            a0r = ar_row
            a0i = ai_row
        else:
            if LD_STATIC:
                mag0 = mag_row
            else:
                mag0 = tl.exp(tl.load(ld_base + t0_64 * ld_st + offs_p, mask=mask_p, other=0.0))
            if TH_STATIC:
                sn0 = sn_row
                cs0 = cs_row
            else:
                sn0, cs0 = _sincos(tl.load(th_base + t0_64 * th_st + offs_p, mask=mask_p, other=0.0))
            a0r = mag0 * cs0
            a0i = -(mag0 * sn0)
        mur = a0r * l0r + a0i * l0i
        mui = a0r * l0i - a0i * l0r

    if NEED_DH0:
        tl.store(dh0_ptr + bh64 * D + offs_d, tl.reshape(tl.join(mur, mui), (2 * BP,)), mask=mask_d)
    if NEED_DLD and LD_STATIC:
        tl.store(dld_base + offs_p, acc_ld, mask=mask_p)
    if NEED_DTH and TH_STATIC:
        tl.store(dth_base + offs_p, acc_th, mask=mask_p)


# ----------------------------------------------------------------------------------------------------------
# Launch configuration
# ----------------------------------------------------------------------------------------------------------
def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# (BT, BP, num_warps). The forward's BT is also the checkpoint interval; the backward's BT must be a
# multiple of it (pruned below). All are 4–8 fp32 elements of a tile per thread: for sm_90 they compile to
# 64–170 registers without spills and 16-byte loads and stores (gpu_check.aot). The last three read 64–128
# contiguous bytes of a bf16 row per time step instead of 16–32: on the H100 the tuner picked (64, 8, 2) from
# the first eight and reached 48 % of copy bandwidth, and short strided rows are one suspect (docs/gpu.md).
_FWD_CONFIGS = [(64, 16, 4), (32, 16, 2), (32, 32, 4), (128, 8, 4), (64, 8, 2), (128, 16, 8), (32, 16, 4),
                (64, 8, 4), (16, 32, 4), (16, 64, 4), (32, 32, 8)]
_BWD_CONFIGS = [(64, 16, 4), (32, 16, 2), (32, 32, 4), (128, 8, 4), (64, 8, 2), (32, 16, 4), (64, 8, 4),
                (16, 32, 4), (16, 64, 4), (32, 32, 8)]
_MIN_CK_BT = min(c[0] for c in _FWD_CONFIGS)
# Problems smaller than this (pairs × steps) use the fixed default instead of autotuning.
_AUTOTUNE_MIN_WORK = 1 << 22
_AUTOTUNE = (not _INTERPRET) and read_env("HYBRID_SCAN_AUTOTUNE", ("1", "0"), "1") == "1"
# How the backward gets a_{t+1} for time-varying decay/angle: "gather" (tl.gather of the tile's own a, Triton
# >= 3.2) or "load" (a second, shifted load and exp/cos/sin). $HYBRID_SCAN_SHIFT overrides, for A/B timing.
_SHIFT_GATHER = read_env("HYBRID_SCAN_SHIFT", ("gather", "load"),
                         "gather" if hasattr(tl, "gather") else "load") == "gather"


def default_blocks(T: int, P: int) -> tuple[int, int, int]:
    """(BT, BP, num_warps) without autotuning. Under the interpreter: small tiles (its scan costs per
    element and tests want many tiles and pair blocks)."""
    if _INTERPRET:
        return 8, min(8, _next_pow2(P)), 1
    return max(16, min(64, _next_pow2(T))), min(16, _next_pow2(P)), 4


def _prune(configs, named_args, **kwargs):
    """Drop tiles wider than the problem (P) or longer than it (T); backward: BT must be a multiple of
    the forward's checkpoint interval CK_BT."""
    T, P = named_args["T"], named_args["P"]
    bp_cap = max(8, _next_pow2(P))
    bt_cap = max(32, _next_pow2(T))
    ck = kwargs.get("CK_BT")
    kept = [c for c in configs
            if c.kwargs["BP"] <= bp_cap and c.kwargs["BT"] <= bt_cap
            and (ck is None or (c.kwargs["BT"] % ck == 0))]
    if not kept and ck is not None:  # the forward chose a long tile: use it for the backward too
        kept = [triton.Config({"BT": ck, "BP": min(16, bp_cap)}, num_warps=8 if ck >= 128 else 4)]
    return kept or configs[:1]


def _tuned(kernel, configs, key):
    """Autotuned over ``configs`` per ``key``. The timings are kept in Triton's cache folder where this Triton can
    (``cache_results``, Triton ≥ 3.2): a later process then compiles the chosen tile only, instead of every tile.
    On the H100 a process's first hybrid step took 72 s at T = 8K, against 2 s for the Transformer; compiling and
    timing up to 21 tiles is one suspect, FlexAttention's compile the other (docs/gpu.md)."""
    extra = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    return triton.autotune(
        configs=[triton.Config({"BT": bt, "BP": bp}, num_warps=w) for bt, bp, w in configs],
        key=key, prune_configs_by={"early_config_prune": _prune}, **extra)(kernel)


_FLAG_KEY = ["T_BUCKET", "P", "LD_STATIC", "TH_STATIC"]
if _AUTOTUNE:
    _fwd_tuned = _tuned(_scan_fwd_kernel, _FWD_CONFIGS, _FLAG_KEY + ["HAS_H0", "SAVE_CK"])
    _bwd_tuned = _tuned(_scan_bwd_kernel, _BWD_CONFIGS,
                        _FLAG_KEY + ["CK_BT", "HAS_DY", "HAS_DHT", "NEED_DX", "NEED_DLD", "NEED_DTH"])


def empty_buffer(shape, dtype, device) -> torch.Tensor:
    """Every output / scratch buffer of this module is allocated here (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _broadcast_strides(t: torch.Tensor, B: int) -> tuple[int, int, bool]:
    """(batch stride, time stride, static-in-time) of a contiguous (Bd, Td, H, P) tensor."""
    sb = t.stride(0) if (t.shape[0] == B and B > 1) else 0
    static = t.shape[1] == 1
    return sb, (0 if static else t.stride(1)), static


def _use_autotune(B, T, H, P, blocks) -> bool:
    return _AUTOTUNE and blocks is None and B * T * H * P >= _AUTOTUNE_MIN_WORK


def _on_device(t: torch.Tensor):
    """Launch on the tensor's GPU (Triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------------------
# Host wrappers
# ----------------------------------------------------------------------------------------------------------
_FORCED: tuple | None = None  # (block_t, block_p) while ``forced_blocks`` holds


@contextlib.contextmanager
def forced_blocks(block_t=None, block_p=None):
    """Every Triton scan inside runs at these tiles instead of the heuristic / autotuned ones: ``block_t`` an int
    (both passes) or ``(forward, backward)`` with the backward's a multiple of the forward's, ``block_p``; powers
    of two, None for the default. For tests of tile edges and for tuning."""
    global _FORCED
    before, _FORCED = _FORCED, (block_t, block_p)
    try:
        yield
    finally:
        _FORCED = before


def _forced(T: int, P: int) -> tuple | None:
    """(BT_fwd, BT_bwd, BP) under ``forced_blocks``, else None."""
    if _FORCED is None:
        return None
    block_t, block_p = _FORCED
    dbt, dbp, _ = default_blocks(T, P)
    bt = block_t if block_t is not None else dbt
    bt_f, bt_b = (bt, bt) if isinstance(bt, int) else tuple(bt)
    return bt_f, bt_b, block_p if block_p is not None else dbp


def _forward(x, log_decay, theta, initial_state, save_ck, blocks=None):
    """Launch the forward. ``blocks``: None (``forced_blocks``', else heuristic / autotune) or (BT_fwd, BT_bwd, BP)
    to force. Returns y, final, checkpoints (or None) and the forward's time tile (the checkpoint interval)."""
    B, T, H, D = x.shape
    P = D // 2
    blocks = _forced(T, P) if blocks is None else blocks
    tune = _use_autotune(B, T, H, P, blocks)
    if blocks is not None:
        bt, bp, warps = blocks[0], blocks[2], 4
    else:
        bt, bp, warps = default_blocks(T, P)
    # Checkpoint rows are allocated for the shortest tile the launch may pick.
    nck = triton.cdiv(T, _MIN_CK_BT if tune else bt)
    y = empty_buffer((B, T, H, D), x.dtype, x.device)
    final = empty_buffer((B, H, D), torch.float32, x.device)
    ck = empty_buffer((B, H, nck, D), torch.float32, x.device) if save_ck else final
    ld_sb, ld_st, ld_static = _broadcast_strides(log_decay, B)
    th_sb, th_st, th_static = _broadcast_strides(theta, B)
    h0 = initial_state if initial_state is not None else final
    args = (x, y, log_decay, theta, h0, final, ck, T, H, P, nck, ld_sb, ld_st, th_sb, th_st, _next_pow2(T))
    flags = dict(LD_STATIC=ld_static, TH_STATIC=th_static, HAS_H0=initial_state is not None, SAVE_CK=save_ck)
    if tune:
        _fwd_tuned[lambda meta: (B * H, triton.cdiv(P, meta["BP"]))](*args, **flags)
        bt = _fwd_tuned.best_config.kwargs["BT"]
    else:
        _scan_fwd_kernel[(B * H, triton.cdiv(P, bp))](*args, **flags, BT=bt, BP=bp, num_warps=warps)
    return y, final, (ck if save_ck else None), bt


def _backward(x, log_decay, theta, ck, ck_bt, dy, dfinal, needs, blocks=None):
    need_dx, need_dld, need_dth, need_dh0 = needs
    B, T, H, D = x.shape
    P = D // 2
    blocks = _forced(T, P) if blocks is None else blocks
    dev = x.device
    tune = _use_autotune(B, T, H, P, blocks)
    if blocks is not None:
        bt, bp, warps = blocks[1], blocks[2], 4
    else:
        _, bp, warps = default_blocks(T, P)
        bt = ck_bt
    ld_sb, ld_st, ld_static = _broadcast_strides(log_decay, B)
    th_sb, th_st, th_static = _broadcast_strides(theta, B)

    dummy = ck
    dx = empty_buffer((B, T, H, D), x.dtype, dev) if need_dx else dummy
    # Per-batch gradient buffers (B, Td, H, P); summed over batch below when the input has Bd == 1.
    dld = empty_buffer((B, log_decay.shape[1], H, P), torch.float32, dev) if need_dld else dummy
    dth = empty_buffer((B, theta.shape[1], H, P), torch.float32, dev) if need_dth else dummy
    dh0 = empty_buffer((B, H, D), torch.float32, dev) if need_dh0 else dummy
    dld_sb, dld_st = (dld.stride(0), 0 if ld_static else dld.stride(1)) if need_dld else (0, 0)
    dth_sb, dth_st = (dth.stride(0), 0 if th_static else dth.stride(1)) if need_dth else (0, 0)
    if dy is not None:
        dy = dy.contiguous()
    if dfinal is not None:
        dfinal = dfinal.to(torch.float32).contiguous()

    args = (x, dummy if dy is None else dy, log_decay, theta, ck, dummy if dfinal is None else dfinal,
            dx, dld, dth, dh0,
            T, H, P, ck.shape[2], ld_sb, ld_st, th_sb, th_st, dld_sb, dld_st, dth_sb, dth_st, _next_pow2(T))
    flags = dict(LD_STATIC=ld_static, TH_STATIC=th_static, CK_BT=ck_bt,
                 HAS_DY=dy is not None, HAS_DHT=dfinal is not None,
                 NEED_DX=need_dx, NEED_DLD=need_dld, NEED_DTH=need_dth, NEED_DH0=need_dh0,
                 SHIFT_GATHER=_SHIFT_GATHER)
    if tune:
        _bwd_tuned[lambda meta: (B * H, triton.cdiv(P, meta["BP"]))](*args, **flags)
    else:
        if bt % ck_bt:
            raise ValueError(f"backward time tile {bt} must be a multiple of the forward's {ck_bt}")
        _scan_bwd_kernel[(B * H, triton.cdiv(P, bp))](*args, **flags, BT=bt, BP=bp, num_warps=warps)

    def batch_reduced(buf, t):
        return buf.sum(dim=0, keepdim=True) if (t.shape[0] == 1 and B > 1) else buf

    return (dx if need_dx else None,
            batch_reduced(dld, log_decay) if need_dld else None,
            batch_reduced(dth, theta) if need_dth else None,
            dh0 if need_dh0 else None)


def checkpoint_rows(B: int, T: int, H: int, P: int) -> int:
    """Rows per (batch, head) of the forward's checkpoint buffer ``(B, H, rows, D)`` at the default tiles."""
    tune = _use_autotune(B, T, H, P, None)
    return triton.cdiv(T, _MIN_CK_BT if tune else default_blocks(T, P)[0])


def triton_forward(x, log_decay, theta, initial_state, save_checkpoints: bool):
    """The forward at the default tiles: ``(y, final, checkpoints or None, checkpoint interval)``."""
    with _on_device(x):
        return _forward(x, log_decay, theta, initial_state, save_ck=save_checkpoints)


def triton_backward(x, log_decay, theta, checkpoints, ck_bt, dy, dfinal, needs):
    """Gradients ``(dx, dlog_decay, dtheta, dinitial_state)`` (None where ``needs`` is False)."""
    with _on_device(x):
        return _backward(x, log_decay, theta, checkpoints, ck_bt, dy, dfinal, needs)
