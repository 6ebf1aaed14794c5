"""The scan part's packed-batch rows: a training batch packed by documents, scanned as one row and as one row per
window (``PackedOffsets.row_len``), at the ``gpu-long`` budget's step (32 windows of 2048 tokens) and an R
layer's heads of the ``small`` models (8 heads of 64: 256 rotary pairs a token).

Why: the Triton kernels walk time one step after another, one program per (row, head, block of pairs). One
packed row gives them 8·⌈32/BP⌉ programs, 16 at the tiles the H100 tuned (BP 16), for 65,536 steps each,
on a GPU of 132 SMs; a row per window gives 32 times as many, each for 2,048 steps. The trainer packs by
documents by default, so this is the scan every default hybrid training step ran before 2026-11-28. The decay
is the static hybrid's after its restarts at document starts (a per-token tensor), the angle its static one.
One row is scanned as the library now runs it: split in time where "auto" splits it (32 pieces on a GPU of 132
SMs); ``scan_long_row`` times one such row in one pass, the way it ran before.
"""
from __future__ import annotations

import torch

from .context import CheckContext
from .scan_ways import time_ways

WINDOWS, WINDOW, HEADS, HEAD_DIM = 32, 2048, 8, 64


def _batch(device: torch.device, dry_run: bool):
    """(x, log_decay, theta, the offsets' bounds): windows with a document start every ~300 tokens inside."""
    rows, L, H, D = (2, 12, 2, 8) if dry_run else (WINDOWS, WINDOW, HEADS, HEAD_DIM)
    g = torch.Generator().manual_seed(0)
    starts = {r * L for r in range(rows)}
    starts |= set(torch.randint(1, rows * L, (max(1, rows * L // 300),), generator=g).tolist())
    bounds = sorted(starts) + [rows * L]
    gd = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, rows * L, H, D, generator=gd, device=device).to(torch.bfloat16)
    ld = -(1e-3 + 0.5 * torch.rand(H, D // 2, generator=gd, device=device))
    th = torch.randn(H, D // 2, generator=gd, device=device)
    return (x, ld, th, bounds), f"packed {rows}x{L}x{H}x{D}"


def ways(device: torch.device, dry_run: bool, backend: str, name: str) -> tuple:
    """``(leaves, ways, label)`` for ``scan_ways.time_ways``: named ``name`` + ", a row per window" / ", one packed
    row (auto: C pieces)" (the ms; bytes are not counted here: the two ways move the same, but for the time split's
    second pass, which ``scan_long_row`` times apart). The prewarm compiles them too."""
    from hybrid.kernels import complex_scan
    from hybrid.kernels.complex_scan.time_split import pieces_for
    from hybrid.kernels.varlen import PackedOffsets

    (x, ld, th, bounds), shape = _batch(device, dry_run)
    windows = PackedOffsets.from_bounds(bounds, device=device)
    one_row = PackedOffsets(windows.cu_seqlens, windows.bounds, windows.max_len)  # the window length unknown
    _, T, H, D = x.shape
    pieces = pieces_for(1, T, H, D // 2, device, backend)  # one row is split in time where "auto" splits it

    def way(offsets):
        return lambda *leaves: complex_scan(*leaves, cu_seqlens=offsets, backend=backend, check_values=False)[0]
    return ((x, ld, th), [(name + ", a row per window", way(windows), {"row_len": windows.row_len}),
                          (name + f", one packed row (auto: {pieces} pieces)", way(one_row),
                           {"row_len": None, "pieces": pieces})],
            dict(shape=shape, dtype="bfloat16", mode="static, restarted at documents"))


def run(ctx: CheckContext, backend: str, name: str) -> None:
    """Both ways, forward and forward+backward, as ``scan speed`` rows (``ways``)."""
    time_ways(ctx, *ways(ctx.device, ctx.dry_run, backend, name))
