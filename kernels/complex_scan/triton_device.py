"""Device functions shared by the Triton scan's two layouts (``triton_scan.py``: a time tile scanned across
threads; ``triton_runs.py``: runs of steps carried sequentially in each thread): the complex affine combine of
the associative scans, ``a = exp(log_decay − i·theta)`` with one range reduction for sin and cos, and the
decay of a time tile with its static (time-broadcast) parts precomputed per pair."""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["affine_combine", "affine_combine_excl", "sincos", "complex_decay", "tile_decay", "static_rows"]


@triton.jit
def affine_combine(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2):
    """Compose ``s ↦ a1·s + b1`` followed by ``s ↦ a2·s + b2`` (complex): ``(a2·a1, a2·b1 + b2)``."""
    ar = ar2 * ar1 - ai2 * ai1
    ai = ar2 * ai1 + ai2 * ar1
    br = ar2 * br1 - ai2 * bi1 + br2
    bi = ar2 * bi1 + ai2 * br1 + bi2
    return ar, ai, br, bi


@triton.jit
def affine_combine_excl(ar1, ai1, br1, bi1, er1, ei1, ar2, ai2, br2, bi2, er2, ei2):
    """``affine_combine`` that also carries ``e = b − x_last`` (the state just before the segment's last
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
def sincos(th):
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
    sn, cs = sincos(th)
    m = tl.exp(ld)
    return m * cs, -(m * sn)


@triton.jit
def tile_decay(ld_ptrs, th_ptrs, mask2, rows, mag_row, sn_row, cs_row, ar_row, ai_row,
               LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr):
    """``a`` over a (steps, BP) block; a static decay's exp and a static angle's sin/cos come precomputed per pair
    (``static_rows``), and with both static ``a`` itself (``ar_row``, ``ai_row``). Rows outside ``rows`` (padding
    steps) get the identity ``a = 1``.
    """
    if LD_STATIC and TH_STATIC:
        ar = tl.where(rows, ar_row[None, :], 1.0)
        ai = tl.where(rows, ai_row[None, :], 0.0)
    else:
        ar, ai = _varying_decay(ld_ptrs, th_ptrs, mask2, rows, mag_row, sn_row, cs_row, LD_STATIC, TH_STATIC)
    return ar, ai


@triton.jit
def _varying_decay(ld_ptrs, th_ptrs, mask2, rows, mag_row, sn_row, cs_row,
                   LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr):
    """``tile_decay`` when at most one of decay / angle is static."""
    if TH_STATIC:
        sn = sn_row[None, :]
        cs = cs_row[None, :]
    else:
        sn, cs = sincos(tl.load(th_ptrs, mask=mask2, other=0.0))
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
def static_rows(ld_base, th_base, offs_p, mask_p, BP: tl.constexpr, LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr):
    """|a|, sin θ, cos θ and a = |a|·e^{−iθ} of a time-invariant decay / angle, (BP,) each (zeros if varying)."""
    mag_row = tl.zeros((BP,), dtype=tl.float32)
    sn_row = tl.zeros((BP,), dtype=tl.float32)
    cs_row = tl.zeros((BP,), dtype=tl.float32)
    if LD_STATIC:
        mag_row = tl.exp(tl.load(ld_base + offs_p, mask=mask_p, other=0.0))
    if TH_STATIC:
        sn_row, cs_row = sincos(tl.load(th_base + offs_p, mask=mask_p, other=0.0))
    return mag_row, sn_row, cs_row, mag_row * cs_row, -(mag_row * sn_row)
