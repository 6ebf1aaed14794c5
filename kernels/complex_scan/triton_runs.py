"""The Triton scan's second layout, "runs": each thread carries ``R`` consecutive steps of one rotary pair
sequentially, and only the ``S`` runs of a time tile (``BT = S·R`` steps) are combined across threads.

Same op, arguments, checkpoints and gradients as the tile layout of ``triton_scan.py`` (its docstring has the
math); the host there picks the layout (``$HYBRID_SCAN_LAYOUT``, ``scan_layout``). Why a second one: the tile
layout scans all ``BT`` steps of a tile across threads, a tree of ``log2 BT`` complex affine combines per element
with four shuffles each. Compiled for sm_90 (Triton 3.6, bf16, data-dependent decay), its best tuned tile's
forward loop issues 148 machine instructions per pair and step, about what a memory-bound kernel may spend at
the H100's copy bandwidth, and it ran at 48 % of copy. Here a step costs its own recurrence: 4 fused multiply-adds
for the state and 4 for the run's decay product in the first pass, 4 to replay the run from its entering state
in the second; only the runs' ``(product, end state)`` maps go through the cross-thread scan, ``1/R`` of the
elements. 89 instructions per pair-step forward, 138 backward against 329 (``gpu_check.aot --benchmark``;
docs/design.md, "The Triton scan"). With its loop pipelined over 3 stages it is the default since its first GPU
run: 74 % of copy bandwidth forward and 67 % forward+backward on an H100, against 48 and 43 % for the tile layout.

A tile's step ``r`` of run ``s`` is row ``s·R + r``: the ``R`` loads of a tile each read ``S`` rows ``R`` apart,
so that the ``R`` values of one (run, pair) land in the same thread (the same position of ``R`` equally laid out
``(S, BP)`` blocks) and the run's recurrence is elementwise arithmetic between them.

The backward needs no shifted read of ``a_{t+1}``: inside a run the next step's decay is in the same thread, and
across runs the map from the adjoint arriving at run ``s``'s last step to the one arriving at run ``s−1``'s,
``μ ↦ conj(a_first)·(C·μ + G)``, carries it. A static decay's or angle's gradient accumulates per (run, pair) in
registers across every tile and is reduced across threads once, at the end.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_device import affine_combine, static_rows, tile_decay

__all__ = ["RUNS_FWD_CONFIGS", "RUNS_BWD_CONFIGS", "runs_default", "runs_fwd_kernel", "runs_bwd_kernel"]


# _lanes_along_runs. A block's pairs are contiguous in memory, so the compiler would give consecutive lanes
# consecutive pairs; the shift to the run before (tl.gather) and the scan across runs want consecutive lanes on
# consecutive runs, and every (S, BP) block would be converted between the two (shuffles or shared memory).
# Multiplying the pair offsets by a 1 it cannot see (P // P) hides their contiguity: every load then takes
# the runs-first order. A warp's load touches the same addresses either way (S rows of BP whole pairs).


@triton.jit
def _as_pairs(ptr):
    """``ptr`` (to interleaved float32 / bfloat16 / float16 values) as a pointer to whole pairs: 64 / 32-bit words.

    A pair loaded as one word lands in one thread in the decay's layout (a block of pairs, contiguous along the
    pairs); loading the interleaved values and splitting them, or loading every other value, gave the compiler
    two layouts to convert between, through shared memory with a barrier each (sm_90, Triton 3.6)."""
    if ptr.dtype.element_ty == tl.float32:
        return ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
    else:
        return ptr.to(tl.pointer_type(tl.uint32), bitcast=True)


@triton.jit
def _load_pairs(ptrs, mask, DT: tl.constexpr):
    """Whole pairs at ``ptrs`` (``_as_pairs``), as float32 (real, imaginary); ``DT`` the values' dtype."""
    w = tl.load(ptrs, mask=mask, other=0)
    if DT == tl.float32:
        re = (w & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
        im = (w >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    else:
        re = (w & 0xFFFF).to(tl.uint16).to(DT, bitcast=True).to(tl.float32)
        im = (w >> 16).to(tl.uint16).to(DT, bitcast=True).to(tl.float32)
    return re, im


@triton.jit
def _store_pairs(ptrs, re, im, mask, DT: tl.constexpr):
    """(real, imaginary) float32 rounded to ``DT`` and stored as whole pairs at ``ptrs`` (``_as_pairs``)."""
    if DT == tl.float32:
        w = re.to(tl.uint32, bitcast=True).to(tl.uint64) | (im.to(tl.uint32, bitcast=True).to(tl.uint64) << 32)
    else:
        w = (re.to(DT).to(tl.uint16, bitcast=True).to(tl.uint32)
             | (im.to(DT).to(tl.uint16, bitcast=True).to(tl.uint32) << 16))
    tl.store(ptrs, w, mask=mask)


@triton.jit
def _load_state(ptrs, mask):
    """A float32 state's pairs at the real parts' pointers ``ptrs`` (BP,), as (real, imaginary)."""
    return tl.load(ptrs, mask=mask, other=0.0), tl.load(ptrs + 1, mask=mask, other=0.0)


@triton.jit
def _store_state(ptrs, re, im, mask):
    tl.store(ptrs, re, mask=mask)
    tl.store(ptrs + 1, im, mask=mask)


@triton.jit
def _entering(er_end, ei_end, cr, ci, offs_s, S: tl.constexpr, BP: tl.constexpr):
    """The state entering each run: the run before's end state, the tile's carry ``c`` (BP,) for run 0."""
    prev = tl.broadcast_to(tl.maximum(offs_s - 1, 0)[:, None], (S, BP))
    first = (offs_s == 0)[:, None]
    return (tl.where(first, cr[None, :], tl.gather(er_end, prev, axis=0)),
            tl.where(first, ci[None, :], tl.gather(ei_end, prev, axis=0)))


# ----------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def runs_fwd_kernel(
    x_ptr, y_ptr, ld_ptr, th_ptr, h0_ptr, hT_ptr, ck_ptr,
    T, H, P, NCK,
    ld_sb, ld_st, th_sb, th_st,
    T_BUCKET,  # only an autotune key (``tuning_bucket``: T rounded up to a power of two, at most 1024)
    S: tl.constexpr, R: tl.constexpr, BP: tl.constexpr,
    LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr,
    HAS_H0: tl.constexpr, SAVE_CK: tl.constexpr,
    STAGES: tl.constexpr = 1,  # software pipelining of the loop over tiles (1: none; see ``runs_stages``)
):
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    b64 = b.to(tl.int64)
    bh64 = pid_bh.to(tl.int64)
    D = 2 * P
    BT: tl.constexpr = S * R

    offs_s = tl.arange(0, S)
    offs_p = pid_p * BP + tl.arange(0, BP) * (P // P)  # (P // P: see _lanes_along_runs)
    mask_p = offs_p < P
    is_last_run = (offs_s == S - 1)[:, None]

    # Offsets of the first step of every run inside a tile (int32); tile and step bases are int64.
    x_runs = (offs_s * R)[:, None] * (H * P) + offs_p[None, :]  # in pairs
    ld_runs = (offs_s * R)[:, None] * ld_st + offs_p[None, :]
    th_runs = (offs_s * R)[:, None] * th_st + offs_p[None, :]
    DT: tl.constexpr = x_ptr.dtype.element_ty
    x_base = _as_pairs(x_ptr) + (b64 * T * H + h) * P
    y_base = _as_pairs(y_ptr) + (b64 * T * H + h) * P
    ld_base = ld_ptr + b64 * ld_sb + h * P
    th_base = th_ptr + b64 * th_sb + h * P

    mag_row, sn_row, cs_row, ar_row, ai_row = static_rows(ld_base, th_base, offs_p, mask_p, BP, LD_STATIC, TH_STATIC)

    if HAS_H0:
        cr, ci = _load_state(h0_ptr + bh64 * D + 2 * offs_p, mask_p)
    else:
        cr = tl.zeros((BP,), dtype=tl.float32)
        ci = tl.zeros((BP,), dtype=tl.float32)

    NT = tl.cdiv(T, BT)
    for k in tl.range(0, NT, num_stages=STAGES):
        t0_64 = tl.cast(k, tl.int64) * BT
        if SAVE_CK:  # state entering this tile
            _store_state(ck_ptr + (bh64 * NCK + k) * D + 2 * offs_p, cr, ci, mask_p)

        # 1. Every run from a zero state: its end state (lr, li) and the product of its decays (pr, pi).
        xrs = ()
        xis = ()
        ars = ()
        ais = ()
        lr = tl.zeros((S, BP), dtype=tl.float32)
        li = tl.zeros((S, BP), dtype=tl.float32)
        pr = tl.full((S, BP), 1.0, tl.float32)
        pi = tl.zeros((S, BP), dtype=tl.float32)
        for r in tl.static_range(R):
            rows = ((k * BT + offs_s * R + r) < T)[:, None]
            xr, xi = _load_pairs(x_base + (t0_64 + r) * (H * P) + x_runs, rows & mask_p[None, :], DT)
            ar, ai = tile_decay(ld_base + (t0_64 + r) * ld_st + ld_runs, th_base + (t0_64 + r) * th_st + th_runs,
                                rows & mask_p[None, :], rows, mag_row, sn_row, cs_row, ar_row, ai_row,
                                LD_STATIC, TH_STATIC)
            lr, li = ar * lr - ai * li + xr, ar * li + ai * lr + xi
            pr, pi = ar * pr - ai * pi, ar * pi + ai * pr
            xrs = xrs + (xr,)
            xis = xis + (xi,)
            ars = ars + (ar,)
            ais = ais + (ai,)

        # 2. Across runs: (product, end state) composed in order, applied to the carry.
        Ar, Ai, Br, Bi = tl.associative_scan((pr, pi, lr, li), axis=0, combine_fn=affine_combine)
        er_end = Ar * cr[None, :] - Ai * ci[None, :] + Br
        ei_end = Ar * ci[None, :] + Ai * cr[None, :] + Bi
        sr, si = _entering(er_end, ei_end, cr, ci, offs_s, S, BP)

        # 3. Every run again from the state entering it.
        for r in tl.static_range(R):
            rows = ((k * BT + offs_s * R + r) < T)[:, None]
            ar = ars[r]
            ai = ais[r]
            sr, si = ar * sr - ai * si + xrs[r], ar * si + ai * sr + xis[r]
            _store_pairs(y_base + (t0_64 + r) * (H * P) + x_runs, sr, si, rows & mask_p[None, :], DT)

        cr = tl.sum(tl.where(is_last_run, er_end, 0.0), axis=0)
        ci = tl.sum(tl.where(is_last_run, ei_end, 0.0), axis=0)

    _store_state(hT_ptr + bh64 * D + 2 * offs_p, cr, ci, mask_p)


# ----------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------
@triton.jit
def runs_bwd_kernel(
    x_ptr, dy_ptr, ld_ptr, th_ptr, ck_ptr, dhT_ptr,
    dx_ptr, dld_ptr, dth_ptr, dh0_ptr,
    T, H, P, NCK,
    ld_sb, ld_st, th_sb, th_st,
    dld_sb, dld_st, dth_sb, dth_st,
    T_BUCKET,  # only an autotune key
    S: tl.constexpr, R: tl.constexpr, CK_BT: tl.constexpr, BP: tl.constexpr,
    LD_STATIC: tl.constexpr, TH_STATIC: tl.constexpr,
    HAS_DY: tl.constexpr, HAS_DHT: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DLD: tl.constexpr, NEED_DTH: tl.constexpr, NEED_DH0: tl.constexpr,
    STAGES: tl.constexpr = 1,
):
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    b64 = b.to(tl.int64)
    bh64 = pid_bh.to(tl.int64)
    D = 2 * P
    BT: tl.constexpr = S * R
    NEED_STATES: tl.constexpr = NEED_DLD or NEED_DTH

    offs_s = tl.arange(0, S)
    offs_p = pid_p * BP + tl.arange(0, BP) * (P // P)  # (P // P: see _lanes_along_runs)
    mask_p = offs_p < P
    is_first_run = (offs_s == 0)[:, None]
    is_last_run = (offs_s == S - 1)[:, None]
    next_run = tl.broadcast_to(tl.minimum(offs_s + 1, S - 1)[:, None], (S, BP))

    x_runs = (offs_s * R)[:, None] * (H * P) + offs_p[None, :]  # in pairs
    ld_runs = (offs_s * R)[:, None] * ld_st + offs_p[None, :]
    th_runs = (offs_s * R)[:, None] * th_st + offs_p[None, :]
    dld_runs = (offs_s * R)[:, None] * dld_st + offs_p[None, :]
    dth_runs = (offs_s * R)[:, None] * dth_st + offs_p[None, :]
    DT: tl.constexpr = x_ptr.dtype.element_ty
    x_base = _as_pairs(x_ptr) + (b64 * T * H + h) * P
    dy_base = _as_pairs(dy_ptr) + (b64 * T * H + h) * P
    dx_base = _as_pairs(dx_ptr) + (b64 * T * H + h) * P
    ld_base = ld_ptr + b64 * ld_sb + h * P
    th_base = th_ptr + b64 * th_sb + h * P
    dld_base = dld_ptr + b64 * dld_sb + h * P
    dth_base = dth_ptr + b64 * dth_sb + h * P

    mag_row, sn_row, cs_row, ar_row, ai_row = static_rows(ld_base, th_base, offs_p, mask_p, BP, LD_STATIC, TH_STATIC)

    # mu: the adjoint arriving at the last step of the current tile from the steps after it.
    if HAS_DHT:
        mur, mui = _load_state(dhT_ptr + bh64 * D + 2 * offs_p, mask_p)
    else:
        mur = tl.zeros((BP,), dtype=tl.float32)
        mui = tl.zeros((BP,), dtype=tl.float32)
    # A static decay's / angle's gradient, per (run, pair) until the end.
    acc_ld = tl.zeros((S, BP), dtype=tl.float32)
    acc_th = tl.zeros((S, BP), dtype=tl.float32)

    NT = tl.cdiv(T, BT)
    for kk in tl.range(0, NT, num_stages=STAGES):
        k = NT - 1 - kk
        t0_64 = tl.cast(k, tl.int64) * BT

        # Every step's a_t, upstream gradient g_t and (for the states) input x_t, run by run.
        ars = ()
        ais = ()
        grs = ()
        gis = ()
        xrs = ()
        xis = ()
        # the forward's runs from a zero state: end state and decay product (for the states entering them)
        lr = tl.zeros((S, BP), dtype=tl.float32)
        li = tl.zeros((S, BP), dtype=tl.float32)
        pr = tl.full((S, BP), 1.0, tl.float32)
        pi = tl.zeros((S, BP), dtype=tl.float32)
        for r in tl.static_range(R):
            rows = ((k * BT + offs_s * R + r) < T)[:, None]
            ar, ai = tile_decay(ld_base + (t0_64 + r) * ld_st + ld_runs, th_base + (t0_64 + r) * th_st + th_runs,
                                rows & mask_p[None, :], rows, mag_row, sn_row, cs_row, ar_row, ai_row,
                                LD_STATIC, TH_STATIC)
            ars = ars + (ar,)
            ais = ais + (ai,)
            if HAS_DY:
                gr, gi = _load_pairs(dy_base + (t0_64 + r) * (H * P) + x_runs, rows & mask_p[None, :], DT)
            else:
                gr = tl.zeros((S, BP), dtype=tl.float32)
                gi = tl.zeros((S, BP), dtype=tl.float32)
            grs = grs + (gr,)
            gis = gis + (gi,)
            if NEED_STATES:
                xr, xi = _load_pairs(x_base + (t0_64 + r) * (H * P) + x_runs, rows & mask_p[None, :], DT)
                xrs = xrs + (xr,)
                xis = xis + (xi,)
                lr, li = ar * lr - ai * li + xr, ar * li + ai * lr + xi
                pr, pi = ar * pr - ai * pi, ar * pi + ai * pr

        # The adjoint inside a run, from its last step back: lambda_r = C_r·mu_s + G_r, mu_s arriving from after.
        cr_ = tl.full((S, BP), 1.0, tl.float32)
        ci_ = tl.zeros((S, BP), dtype=tl.float32)
        Gr = grs[R - 1]
        Gi = gis[R - 1]
        for rb in tl.static_range(R - 2, -1, -1):
            nr = ars[rb + 1]
            ni = -ais[rb + 1]  # conj(a_{t+1})
            cr_, ci_ = nr * cr_ - ni * ci_, nr * ci_ + ni * cr_
            Gr, Gi = nr * Gr - ni * Gi + grs[rb], nr * Gi + ni * Gr + gis[rb]
        # Run s maps mu_s to mu_{s-1} = conj(a_first)·lambda_first; composed from the last run back.
        fr = ars[0]
        fi = -ais[0]
        Mr, Mi, Nr, Ni = tl.associative_scan((fr * cr_ - fi * ci_, fr * ci_ + fi * cr_,
                                              fr * Gr - fi * Gi, fr * Gi + fi * Gr),
                                             axis=0, combine_fn=affine_combine, reverse=True)
        ur = Mr * mur[None, :] - Mi * mui[None, :] + Nr  # mu_{s-1}
        ui = Mr * mui[None, :] + Mi * mur[None, :] + Ni
        lam_r = tl.where(is_last_run, mur[None, :], tl.gather(ur, next_run, axis=0))  # mu_s
        lam_i = tl.where(is_last_run, mui[None, :], tl.gather(ui, next_run, axis=0))

        # lambda at every step, from the run's last back; dx = lambda.
        lrs = ()
        lis = ()
        for rl in tl.static_range(R - 1, -1, -1):
            if rl == R - 1:
                lam_r, lam_i = lam_r + grs[rl], lam_i + gis[rl]
            else:
                nr = ars[rl + 1]
                ni = -ais[rl + 1]
                lam_r, lam_i = nr * lam_r - ni * lam_i + grs[rl], nr * lam_i + ni * lam_r + gis[rl]
            if NEED_DX:
                rows = ((k * BT + offs_s * R + rl) < T)[:, None]
                _store_pairs(dx_base + (t0_64 + rl) * (H * P) + x_runs, lam_r, lam_i, rows & mask_p[None, :], DT)
            lrs = (lam_r,) + lrs
            lis = (lam_i,) + lis

        if NEED_STATES:
            # The forward's states again, from the tile's checkpoint (the forward saved the state entering each
            # of its CK_BT-step tiles; BT is a multiple of CK_BT).
            c0r, c0i = _load_state(ck_ptr + (bh64 * NCK + k * (BT // CK_BT)) * D + 2 * offs_p, mask_p)
            Ar, Ai, Br, Bi = tl.associative_scan((pr, pi, lr, li), axis=0, combine_fn=affine_combine)
            sr, si = _entering(Ar * c0r[None, :] - Ai * c0i[None, :] + Br, Ar * c0i[None, :] + Ai * c0r[None, :] + Bi,
                               c0r, c0i, offs_s, S, BP)
            for r in tl.static_range(R):
                rows = ((k * BT + offs_s * R + r) < T)[:, None]
                ar = ars[r]
                ai = ais[r]
                qr, qi = ar * sr - ai * si, ar * si + ai * sr  # q_t = a_t·s_{t-1}
                sr, si = qr + xrs[r], qi + xis[r]
                # g_z = lambda·conj(q): d log_decay = Re g_z, d theta = −Im g_z
                gzr = lrs[r] * qr + lis[r] * qi
                gzi = lis[r] * qr - lrs[r] * qi
                if NEED_DLD:
                    if LD_STATIC:
                        acc_ld += tl.where(rows, gzr, 0.0)
                    else:
                        tl.store(dld_base + (t0_64 + r) * dld_st + dld_runs, gzr, mask=rows & mask_p[None, :])
                if NEED_DTH:
                    if TH_STATIC:
                        acc_th -= tl.where(rows, gzi, 0.0)
                    else:
                        tl.store(dth_base + (t0_64 + r) * dth_st + dth_runs, -gzi, mask=rows & mask_p[None, :])

        # Carry to the previous tile: conj(a_{t0})·lambda_{t0} = mu_{-1}.
        mur = tl.sum(tl.where(is_first_run, ur, 0.0), axis=0)
        mui = tl.sum(tl.where(is_first_run, ui, 0.0), axis=0)

    if NEED_DH0:
        _store_state(dh0_ptr + bh64 * D + 2 * offs_p, mur, mui, mask_p)
    if NEED_DLD and LD_STATIC:
        tl.store(dld_base + offs_p, tl.sum(acc_ld, axis=0), mask=mask_p)
    if NEED_DTH and TH_STATIC:
        tl.store(dth_base + offs_p, tl.sum(acc_th, axis=0), mask=mask_p)


# ----------------------------------------------------------------------------------------------------------
# Tiles
# ----------------------------------------------------------------------------------------------------------
# (S runs, R steps a run, BP pairs, num_warps): one (run, pair) cell per thread, BT = S·R, 48–170 registers
# without spills on sm_90. With one warp the runs of a tile share a warp, and the cross-run scan and shift are
# shuffles. The forward's tiles are 32 or 64 steps, and the backward has tiles of both lengths (its tile is a
# multiple of the forward's, the checkpoint interval).
RUNS_FWD_CONFIGS = [(4, 8, 8, 1), (4, 8, 16, 2), (8, 4, 16, 4), (2, 16, 16, 1), (8, 8, 16, 4), (4, 16, 8, 1)]
RUNS_BWD_CONFIGS = [(4, 8, 8, 1), (4, 8, 16, 2), (8, 4, 16, 4), (8, 4, 8, 2), (8, 8, 16, 4), (8, 8, 8, 2)]


# ``runs_stages``. With STAGES > 1 the compiler issues the loads of the next STAGES − 1 tiles before it computes
# this one (``tl.range(num_stages=)``: asynchronous copies into shared memory on sm_80+), which hides memory latency
# when few warps share an SM (the best runs tiles take one warp a program); 1 does not. Chosen by the host
# (``triton_scan.scan_layout(..., stages=)``, ``$HYBRID_SCAN_STAGES``): 3 by default, 2.3× faster than 1 forward
# and 2.9× backward on an H100 (docs/research/gpu.md).


def runs_default(T: int, P: int, interpret: bool) -> tuple[int, int, int, int]:
    """(S, R, BP, num_warps) without autotuning. Under the interpreter a tile of 8 steps, as the tile layout's
    (tests want many tiles), in 4 runs of 2: the interpreter's cost grows with the number of steps a tile runs
    one after the other, R per tile, T / S in all (longer runs: ``forced_blocks(..., run=)`` in the tests)."""
    bp = min(8, 1 << max(0, P - 1).bit_length())
    return (4, 2, bp, 1) if interpret else (4, 8, bp, 1)
