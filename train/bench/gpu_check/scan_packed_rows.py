"""The scan part's packed-batch rows: a training batch packed by documents, scanned as one row and as one row per
window (``PackedOffsets.row_len``), at the ``gpu-long`` budget's step (32 windows of 2048 tokens) and an R
layer's heads of the ``small`` models (8 heads of 64: 256 rotary pairs a token).

Why: the Triton kernels walk time one step after another, one program per (row, head, block of pairs). One
packed row gives them 8·⌈32/BP⌉ programs, 16 at the tiles the H100 tuned (BP 16), for 65,536 steps each,
on a GPU of 132 SMs; a row per window gives 32 times as many, each for 2,048 steps. The trainer packs by
documents by default, so this is the scan every default hybrid training step ran before 2026-11-28. The decay
is the static hybrid's after its restarts at document starts (a per-token tensor), the angle its static one.
"""
from __future__ import annotations

import torch

from .context import CheckContext
from .scan_ways import time_ways

WINDOWS, WINDOW, HEADS, HEAD_DIM = 32, 2048, 8, 64


def _batch(ctx: CheckContext):
    """(x, log_decay, theta, the offsets' bounds): windows with a document start every ~300 tokens inside."""
    rows, L, H, D = (2, 12, 2, 8) if ctx.dry_run else (WINDOWS, WINDOW, HEADS, HEAD_DIM)
    g = torch.Generator().manual_seed(0)
    starts = {r * L for r in range(rows)}
    starts |= set(torch.randint(1, rows * L, (max(1, rows * L // 300),), generator=g).tolist())
    bounds = sorted(starts) + [rows * L]
    gd = torch.Generator(device=ctx.device).manual_seed(0)
    x = torch.randn(1, rows * L, H, D, generator=gd, device=ctx.device).to(torch.bfloat16)
    ld = -(1e-3 + 0.5 * torch.rand(H, D // 2, generator=gd, device=ctx.device))
    th = torch.randn(H, D // 2, generator=gd, device=ctx.device)
    return (x, ld, th, bounds), f"packed {rows}x{L}x{H}x{D}"


def run(ctx: CheckContext, backend: str, name: str) -> None:
    """Both ways, forward and forward+backward, as ``scan speed`` rows named ``name`` + ", a row per window" / ", one
    packed row" (the ms; bytes are not counted here: the two ways move the same)."""
    from hybrid.kernels import complex_scan
    from hybrid.kernels.varlen import PackedOffsets

    (x, ld, th, bounds), shape = _batch(ctx)
    windows = PackedOffsets.from_bounds(bounds, device=ctx.device)
    one_row = PackedOffsets(windows.cu_seqlens, windows.bounds, windows.max_len)  # the window length unknown

    def way(offsets):
        return lambda *leaves: complex_scan(*leaves, cu_seqlens=offsets, backend=backend, check_values=False)[0]
    time_ways(ctx, (x, ld, th), [(name + ", a row per window", way(windows), {"row_len": windows.row_len}),
                                 (name + ", one packed row", way(one_row), {"row_len": None})],
              dict(shape=shape, dtype="bfloat16", mode="static, restarted at documents"))
