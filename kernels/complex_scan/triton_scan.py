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

This module's kernels are the "tile" layout: a time tile's ``BT`` steps scanned across threads. The "runs" layout
(``triton_runs.py``: ``R`` steps carried in each thread, ``S`` runs scanned across threads; the default) computes
the same; the host code here launches either (``$HYBRID_SCAN_LAYOUT``, ``scan_layout``), and the backward follows
the forward's. An ``x`` whose pairs are not word-aligned runs in the tile layout.

``triton_forward`` / ``triton_backward`` are what the custom op of ``ops.py`` runs: the one autograd path of the
Triton scan. ``forced_blocks`` forces its tiles (tests of tile edges, tuning). Knobs: ``$HYBRID_SCAN_AUTOTUNE``,
``$HYBRID_SCAN_SHIFT``, ``$HYBRID_SCAN_LAYOUT``, ``$HYBRID_SCAN_STAGES`` (``hybrid.kernels.env``). The kernel
layouts, the backward's recompute and the tuning: docs/design.md, "The Triton scan".
"""
from __future__ import annotations

import contextlib
import inspect
import os

import torch
import triton
import triton.language as tl

from ..env import read_env
from .triton_device import affine_combine, affine_combine_excl, sincos, static_rows, tile_decay
from .triton_device import complex_decay  # noqa: F401  (public here since before the split: tests import it)
from .triton_runs import RUNS_BWD_CONFIGS, RUNS_FWD_CONFIGS, runs_bwd_kernel, runs_default, runs_fwd_kernel

__all__ = ["triton_forward", "triton_backward", "forced_blocks", "scan_layout", "scan_setting"]

# Decided once, when this module is imported (that is also when ``triton.jit`` decides).
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Multiplies and adds fused into FMAs, as every kernel here was compiled, measured and checked: asked for at each
# launch, since Triton 3.9 warns that its default turns to no fusion in 3.10 (TRITON_DEFAULT_FP_FUSION).
FP_FUSION = {"enable_fp_fusion": True}


# ----------------------------------------------------------------------------------------------------------
# Forward kernel
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def _scan_fwd_kernel(
    x_ptr, y_ptr, ld_ptr, th_ptr, h0_ptr, hT_ptr, ck_ptr,
    T, H, P, NCK,
    ld_sb, ld_st, th_sb, th_st,
    T_BUCKET,  # only an autotune key (``tuning_bucket``: T rounded up to a power of two, at most 1024)
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
    mag_row, sn_row, cs_row, ar_row, ai_row = static_rows(ld_base, th_base, offs_p, mask_p, BP, LD_STATIC, TH_STATIC)

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
        ar, ai = tile_decay(ld_base + t0_64 * ld_st + ld_tile, th_base + t0_64 * th_st + th_tile, m2,
                            mask_t[:, None], mag_row, sn_row, cs_row, ar_row, ai_row, LD_STATIC, TH_STATIC)

        Ar, Ai, Br, Bi = tl.associative_scan((ar, ai, xr, xi), axis=0, combine_fn=affine_combine)
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
    mag_row, sn_row, cs_row, ar_row, ai_row = static_rows(ld_base, th_base, offs_p, mask_p, BP, LD_STATIC, TH_STATIC)

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
        ar, ai = tile_decay(ld_base + t0_64 * ld_st + ld_tile, th_base + t0_64 * th_st + th_tile, m2,
                            mask_t[:, None], mag_row, sn_row, cs_row, ar_row, ai_row, LD_STATIC, TH_STATIC)
        if LD_STATIC and TH_STATIC:
            cr_ = tl.where(mask_s[:, None], ar_row[None, :], 1.0)
            ci_ = tl.where(mask_s[:, None], -ai_row[None, :], 0.0)
        else:
            if SHIFT_GATHER:
                # a_{t+1} is the next row of the same tile: move it in registers / shared memory.
                nxt = tl.broadcast_to(tl.minimum(offs_t + 1, BT - 1)[:, None], (BT, BP))
                cr_ = tl.where(mask_s[:, None], tl.gather(ar, nxt, axis=0), 1.0)
                ci_ = tl.where(mask_s[:, None], -tl.gather(ai, nxt, axis=0), 0.0)
            else:
                # Fallback (Triton without tl.gather): the tile loaded again one step later (cache hits)
                # with its exp/sin/cos evaluated again.
                an_r, an_i = tile_decay(ld_base + (t0_64 + 1) * ld_st + ld_tile,
                                        th_base + (t0_64 + 1) * th_st + th_tile, ms2,
                                        mask_s[:, None], mag_row, sn_row, cs_row, ar_row, ai_row,
                                        LD_STATIC, TH_STATIC)
                cr_ = an_r
                ci_ = -an_i

        if HAS_DY:
            g = tl.load(dy_base + t0_64 * (H * D) + x_tile, mask=md2, other=0.0)
            gr, gi = tl.split(tl.reshape(g.to(tl.float32), (BT, BP, 2)))
        else:
            gr = tl.zeros((BT, BP), dtype=tl.float32)
            gi = tl.zeros((BT, BP), dtype=tl.float32)

        # lambda_t = C_t · mu + G_t, with (C_t, G_t) the composite of the maps of steps t..end of tile.
        Cr, Ci, Gr, Gi = tl.associative_scan((cr_, ci_, gr, gi), axis=0, combine_fn=affine_combine,
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
                                                       combine_fn=affine_combine_excl)
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
                sn0, cs0 = sincos(tl.load(th_base + t0_64 * th_st + offs_p, mask=mask_p, other=0.0))
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
# How a tile's steps are spread over threads: "tile" (this module's kernels: the BT steps scanned across threads)
# or "runs" (``triton_runs``: R steps carried sequentially in each thread, S runs scanned across threads).
# $HYBRID_SCAN_LAYOUT picks at import, ``scan_layout`` inside a block (tests, A/B timing). The default is "runs"
# with its loop pipelined over 3 stages: on an H100 (Triton 3.6, bf16, B8·T8192·H16·D128, data-dependent decay)
# 0.50 ms forward and 1.50 ms forward+backward, against the tile layout's 0.75 and 2.34 (docs/research/gpu.md).
_LAYOUTS = ("tile", "runs")
_LAYOUT = read_env("HYBRID_SCAN_LAYOUT", _LAYOUTS, "runs")
# The runs kernels' software pipelining (``triton_runs``, "runs_stages"): 1 (none) to 4. $HYBRID_SCAN_STAGES.
# Unpipelined, the runs layout lost to the tile layout on the H100 (1.15 ms forward): its one-warp programs
# leave the loads' latency exposed.
_STAGES = int(read_env("HYBRID_SCAN_STAGES", ("1", "2", "3", "4"), "3"))
_MIN_CK_BT = {"tile": min(c[0] for c in _FWD_CONFIGS), "runs": min(s * r for s, r, _, _ in RUNS_FWD_CONFIGS)}
# Problems smaller than this (pairs × steps) use the fixed default instead of autotuning.
_AUTOTUNE_MIN_WORK = 1 << 22
# The tuning's length key: T rounded up to a power of two, at most this. From 1024 steps on every candidate tile
# fits and a program walks 16 or more tiles, so one tuning serves every longer T (as it serves every B and H,
# which the key leaves out). Each new key costs a tuning, 12 kernel compiles of several seconds: a model
# evaluated at 2K, 4K, 8K and 16K tuned four times before.
_T_BUCKET_MAX = 1024
_AUTOTUNE = (not _INTERPRET) and read_env("HYBRID_SCAN_AUTOTUNE", ("1", "0"), "1") == "1"
# How the backward gets a_{t+1} for time-varying decay/angle: "gather" (tl.gather of the tile's own a, Triton
# >= 3.2) or "load" (a second, shifted load and exp/cos/sin). $HYBRID_SCAN_SHIFT overrides, for A/B timing.
# (The runs layout needs neither: a_{t+1} is in the same thread.)
_SHIFT_GATHER = read_env("HYBRID_SCAN_SHIFT", ("gather", "load"),
                         "gather" if hasattr(tl, "gather") else "load") == "gather"


def scan_setting(layout: str | None = None, stages: int | None = None) -> str:
    """A setting of the kernels as reports name it, ``"runs, 3 stages"`` or ``"tile"``: the one a Triton scan
    started now runs, or ``layout`` at ``stages``."""
    layout, stages = layout or _LAYOUT, stages or _STAGES
    return "tile" if layout == "tile" else f"{layout}, {stages} stage{'s' * (stages > 1)}"


def tuning_bucket(T: int) -> int:
    """The autotune key of a length ``T`` (``T_BUCKET``)."""
    return min(_next_pow2(T), _T_BUCKET_MAX)


@contextlib.contextmanager
def scan_layout(name: str, stages: int | None = None):
    """Every Triton scan started inside runs in this layout: "tile" or "runs" (see ``_LAYOUTS``); its backward
    follows the forward's. ``stages``: the runs kernels' software pipelining, 1 (none) to 4 (None: unchanged).
    The op's shapes do not depend on it (``checkpoint_rows``), so graphs compiled under one layout run under
    another."""
    global _LAYOUT, _STAGES
    if name not in _LAYOUTS:
        raise ValueError(f"scan_layout: expected one of {_LAYOUTS}, got {name!r}")
    if stages is not None and stages not in (1, 2, 3, 4):
        raise ValueError(f"scan_layout: expected stages in 1..4, got {stages!r}")
    before = _LAYOUT, _STAGES
    _LAYOUT, _STAGES = name, (_STAGES if stages is None else stages)
    try:
        yield
    finally:
        _LAYOUT, _STAGES = before


def default_blocks(T: int, P: int) -> tuple[int, int, int]:
    """(BT, BP, num_warps) of the tile layout without autotuning. Under the interpreter: small tiles (its scan
    costs per element and tests want many tiles and pair blocks)."""
    if _INTERPRET:
        return 8, min(8, _next_pow2(P)), 1
    return max(16, min(64, _next_pow2(T))), min(16, _next_pow2(P)), 4


def time_tile(kwargs: dict) -> int:
    """A launch's time tile: ``BT`` (tile layout) or ``S·R`` (runs layout)."""
    return kwargs["BT"] if "BT" in kwargs else kwargs["S"] * kwargs["R"]


def _prune(configs, named_args, **kwargs):
    """Drop tiles wider than the problem (P) or longer than it (T); backward: BT must be a multiple of
    the forward's checkpoint interval CK_BT."""
    T, P = named_args["T"], named_args["P"]
    bp_cap = max(8, _next_pow2(P))
    bt_cap = max(32, _next_pow2(T))
    ck = kwargs.get("CK_BT")
    kept = [c for c in configs
            if c.kwargs["BP"] <= bp_cap and time_tile(c.kwargs) <= bt_cap
            and (ck is None or (time_tile(c.kwargs) % ck == 0))]
    if not kept and ck is not None:  # the forward chose a long tile: use it for the backward too
        bp = min(16, bp_cap)
        if "BT" in configs[0].kwargs:
            kept = [triton.Config({"BT": ck, "BP": bp}, num_warps=8 if ck >= 128 else 4)]
        else:  # the runs layout's untuned launch at that tile, at the tuned kernel's stages
            meta = _launch_meta("runs", ck, bp, None, T, P)
            warps = meta.pop("num_warps")
            kept = [triton.Config({**meta, "STAGES": configs[0].kwargs["STAGES"]}, num_warps=warps)]
    return kept or configs[:1]


def _tuned(kernel, configs, key):
    """Autotuned over ``configs`` (constexpr dicts with their warps) per ``key``. The timings are kept in Triton's
    cache folder where this Triton can (``cache_results``, Triton ≥ 3.2): a later process then compiles the chosen
    tile only, instead of every tile. On the H100 a process's first hybrid step took 72 s at T = 8K, against 2 s
    for the Transformer; compiling and timing up to 21 tiles is one suspect, FlexAttention's compile the other
    (docs/gpu.md)."""
    extra = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    return triton.autotune(
        configs=[triton.Config(meta, num_warps=w) for meta, w in configs],
        key=key, prune_configs_by={"early_config_prune": _prune}, **extra)(kernel)


_FLAG_KEY = ["T_BUCKET", "P", "LD_STATIC", "TH_STATIC"]
_FWD_KEY = _FLAG_KEY + ["HAS_H0", "SAVE_CK"]
_BWD_KEY = _FLAG_KEY + ["CK_BT", "HAS_DY", "HAS_DHT", "NEED_DX", "NEED_DLD", "NEED_DTH"]
_TUNED: dict = {}  # (layout, "fwd" | "bwd", stages) -> the autotuned kernel, made on first use


def tuned_kernel(layout: str, which: str, stages: int = 1):
    """The autotuned kernel of a layout and pass (the runs kernels at ``stages``), made on first use."""
    key = (layout, which, stages if layout == "runs" else 1)
    if key not in _TUNED:
        if layout == "tile":
            kernel, configs = ((_scan_fwd_kernel, _FWD_CONFIGS) if which == "fwd" else (_scan_bwd_kernel, _BWD_CONFIGS))
            metas = [({"BT": bt, "BP": bp}, w) for bt, bp, w in configs]
        else:
            kernel, configs = ((runs_fwd_kernel, RUNS_FWD_CONFIGS) if which == "fwd"
                               else (runs_bwd_kernel, RUNS_BWD_CONFIGS))
            metas = [({"S": s, "R": r, "BP": bp, "STAGES": stages}, w) for s, r, bp, w in configs]
        _TUNED[key] = _tuned(kernel, metas, _FWD_KEY if which == "fwd" else _BWD_KEY)
    return _TUNED[key]


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
_FORCED: tuple | None = None  # (block_t, block_p, run) while ``forced_blocks`` holds


@contextlib.contextmanager
def forced_blocks(block_t=None, block_p=None, run=None):
    """Every Triton scan inside runs at these tiles instead of the heuristic / autotuned ones: ``block_t`` an int
    (both passes) or ``(forward, backward)`` with the backward's a multiple of the forward's, ``block_p``; powers
    of two, None for the default. ``run``: the runs layout's steps per thread (dividing every ``block_t``; None:
    the default's, or the whole tile if shorter). For tests of tile edges and for tuning."""
    global _FORCED
    before, _FORCED = _FORCED, (block_t, block_p, run)
    try:
        yield
    finally:
        _FORCED = before


def _forced(T: int, P: int) -> tuple | None:
    """(BT_fwd, BT_bwd, BP, run) under ``forced_blocks``, else None."""
    if _FORCED is None:
        return None
    block_t, block_p, run = _FORCED
    dbt, dbp, _ = default_blocks(T, P)
    bt = block_t if block_t is not None else dbt
    bt_f, bt_b = (bt, bt) if isinstance(bt, int) else tuple(bt)
    return bt_f, bt_b, block_p if block_p is not None else dbp, run


def _launch_meta(layout: str, bt: int, bp: int, run, T: int, P: int) -> dict:
    """The constexprs and warps of an untuned launch at time tile ``bt`` and ``bp`` pairs."""
    if layout == "tile":
        return dict(BT=bt, BP=bp, num_warps=4)
    _, r_default, _, _ = runs_default(T, P, _INTERPRET)
    r = run if run is not None else min(r_default, bt)
    if bt % r:
        raise ValueError(f"forced_blocks: run length {r} must divide the time tile {bt}")
    cells = (bt // r) * bp
    return dict(S=bt // r, R=r, BP=bp, STAGES=_STAGES, num_warps=1 if _INTERPRET else max(1, min(8, cells // 32)))


def _default_meta(layout: str, T: int, P: int) -> dict:
    if layout == "tile":
        bt, bp, warps = default_blocks(T, P)
        return dict(BT=bt, BP=bp, num_warps=warps)
    s, r, bp, warps = runs_default(T, P, _INTERPRET)
    return dict(S=s, R=r, BP=bp, STAGES=_STAGES, num_warps=warps)


_KERNELS = {("tile", "fwd"): _scan_fwd_kernel, ("tile", "bwd"): _scan_bwd_kernel,
            ("runs", "fwd"): runs_fwd_kernel, ("runs", "bwd"): runs_bwd_kernel}


def _pairs_aligned(t: torch.Tensor) -> bool:
    """Whether every (real, imaginary) pair of ``t`` starts at a multiple of its size: the runs kernels load and
    store a pair as one 64- or 32-bit word. A contiguous view at an odd element offset is not."""
    return t.data_ptr() % (2 * t.element_size()) == 0


def _forward(x, log_decay, theta, initial_state, save_ck, blocks=None):
    """Launch the forward. ``blocks``: None (``forced_blocks``', else heuristic / autotune) or (BT_fwd, BT_bwd, BP,
    run) to force. Returns y, final, checkpoints (or None) and the forward's time tile (the checkpoint interval,
    negative for the runs layout). An ``x`` whose pairs are not word-aligned runs in the tile layout."""
    B, T, H, D = x.shape
    P = D // 2
    layout = _LAYOUT if _LAYOUT == "tile" or _pairs_aligned(x) else "tile"
    blocks = _forced(T, P) if blocks is None else blocks
    tune = _use_autotune(B, T, H, P, blocks)
    if blocks is not None:
        meta = _launch_meta(layout, blocks[0], blocks[2], blocks[3], T, P)
    else:
        meta = _default_meta(layout, T, P)
    bt = time_tile(meta)
    # Checkpoint rows for the shortest tile any launch may pick (``checkpoint_rows``: whatever the layout).
    nck = triton.cdiv(T, min(_shortest_tile(T, P, tune), bt))
    y = empty_buffer((B, T, H, D), x.dtype, x.device)
    final = empty_buffer((B, H, D), torch.float32, x.device)
    ck = empty_buffer((B, H, nck, D), torch.float32, x.device) if save_ck else final
    ld_sb, ld_st, ld_static = _broadcast_strides(log_decay, B)
    th_sb, th_st, th_static = _broadcast_strides(theta, B)
    h0 = initial_state if initial_state is not None else final
    args = (x, y, log_decay, theta, h0, final, ck, T, H, P, nck, ld_sb, ld_st, th_sb, th_st, tuning_bucket(T))
    flags = dict(LD_STATIC=ld_static, TH_STATIC=th_static, HAS_H0=initial_state is not None, SAVE_CK=save_ck,
                 **FP_FUSION)
    if tune:
        tuned = tuned_kernel(layout, "fwd", _STAGES)
        tuned[lambda m: (B * H, triton.cdiv(P, m["BP"]))](*args, **flags)
        bt = time_tile(tuned.best_config.kwargs)
    else:
        _KERNELS[(layout, "fwd")][(B * H, triton.cdiv(P, meta["BP"]))](*args, **flags, **meta)
    return y, final, (ck if save_ck else None), (-bt if layout == "runs" else bt)


def _backward(x, log_decay, theta, ck, ck_tile, dy, dfinal, needs, blocks=None):
    """``ck_tile``: the forward's time tile, negative for the runs layout: the backward runs in the forward's."""
    need_dx, need_dld, need_dth, need_dh0 = needs
    ck_bt, layout = abs(ck_tile), ("runs" if ck_tile < 0 else "tile")
    B, T, H, D = x.shape
    P = D // 2
    blocks = _forced(T, P) if blocks is None else blocks
    dev = x.device
    tune = _use_autotune(B, T, H, P, blocks)
    if blocks is not None:
        meta = _launch_meta(layout, blocks[1], blocks[2], blocks[3], T, P)
    else:  # the forward's tile, at this layout's default pair block
        meta = _launch_meta(layout, ck_bt, _default_meta(layout, T, P)["BP"], None, T, P)
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
        if layout == "runs" and not _pairs_aligned(dy):
            dy = dy.clone()  # a fresh, aligned copy (the forward checked x)
    if dfinal is not None:
        dfinal = dfinal.to(torch.float32).contiguous()

    args = (x, dummy if dy is None else dy, log_decay, theta, ck, dummy if dfinal is None else dfinal,
            dx, dld, dth, dh0,
            T, H, P, ck.shape[2], ld_sb, ld_st, th_sb, th_st, dld_sb, dld_st, dth_sb, dth_st, tuning_bucket(T))
    flags = dict(LD_STATIC=ld_static, TH_STATIC=th_static, CK_BT=ck_bt, **FP_FUSION,
                 HAS_DY=dy is not None, HAS_DHT=dfinal is not None,
                 NEED_DX=need_dx, NEED_DLD=need_dld, NEED_DTH=need_dth, NEED_DH0=need_dh0)
    if layout == "tile":
        flags["SHIFT_GATHER"] = _SHIFT_GATHER
    if tune:
        tuned_kernel(layout, "bwd", _STAGES)[lambda m: (B * H, triton.cdiv(P, m["BP"]))](*args, **flags)
    else:
        bt = time_tile(meta)
        if bt % ck_bt:
            raise ValueError(f"backward time tile {bt} must be a multiple of the forward's {ck_bt}")
        _KERNELS[(layout, "bwd")][(B * H, triton.cdiv(P, meta["BP"]))](*args, **flags, **meta)

    def batch_reduced(buf, t):
        return buf.sum(dim=0, keepdim=True) if (t.shape[0] == 1 and B > 1) else buf

    return (dx if need_dx else None,
            batch_reduced(dld, log_decay) if need_dld else None,
            batch_reduced(dth, theta) if need_dth else None,
            dh0 if need_dh0 else None)


def _shortest_tile(T: int, P: int, tune: bool) -> int:
    """The shortest forward time tile of either layout: tuned (any config) or not (the defaults). The checkpoint
    rows follow it, so that the op's shape does not depend on the layout a launch takes (an x whose pairs are not
    word-aligned falls back to the tile layout, and the shape function cannot see the alignment)."""
    if tune:
        return min(_MIN_CK_BT.values())
    return min(time_tile(_default_meta(layout, T, P)) for layout in _LAYOUTS)


def checkpoint_rows(B: int, T: int, H: int, P: int) -> int:
    """Rows per (batch, head) of the forward's checkpoint buffer ``(B, H, rows, D)`` at the default tiles."""
    return triton.cdiv(T, _shortest_tile(T, P, _use_autotune(B, T, H, P, None)))


def triton_forward(x, log_decay, theta, initial_state, save_checkpoints: bool):
    """The forward at the default tiles: ``(y, final, checkpoints or None, checkpoint interval)``, the interval
    negative when the forward ran in the runs layout (the backward follows it)."""
    with _on_device(x):
        return _forward(x, log_decay, theta, initial_state, save_ck=save_checkpoints)


def triton_backward(x, log_decay, theta, checkpoints, ck_tile, dy, dfinal, needs):
    """Gradients ``(dx, dlog_decay, dtheta, dinitial_state)`` (None where ``needs`` is False); ``ck_tile``: the
    forward's checkpoint interval as ``triton_forward`` returned it (negative: the runs layout)."""
    with _on_device(x):
        return _backward(x, log_decay, theta, checkpoints, ck_tile, dy, dfinal, needs)
