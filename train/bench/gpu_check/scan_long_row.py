"""The scan part's long-row rows: one row of 65,536 steps through an R layer of the ``small`` models (8 heads of 64),
scanned in one pass and split in time (``kernels/complex_scan/time_split.py``: 32 pieces of 2,048, twice).

Why: one row gives the Triton kernels 16 programs on the H100's 132 SMs (a batch of one long document, a long
prompt's prefill, the models part's 32K rows at two rows). Splitting moves twice the bytes through 32 times the
programs. Predicted: split 3–7× faster than one pass (docs/research/gpu.md), which is why "auto" splits such
grids by default since 2026-11-28; these rows are the measurement that keeps or reverts that default.
"""
from __future__ import annotations

import torch

from .context import CheckContext
from .scan_ways import time_ways

T, HEADS, HEAD_DIM = 65536, 8, 64


def ways(device: torch.device, dry_run: bool, backend: str, name: str) -> tuple:
    """``(leaves, ways, label)`` for ``scan_ways.time_ways``: both ways, bf16 with data-dependent decay, named
    ``name`` + ", split in time (auto: C pieces)" / ", one pass" (the prewarm compiles them too)."""
    from hybrid.kernels import complex_scan
    from hybrid.kernels.complex_scan.time_split import pieces_for, time_split

    steps, H, D = (32, 2, 8) if dry_run else (T, HEADS, HEAD_DIM)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, steps, H, D, generator=g, device=device).to(torch.bfloat16)
    ld = -(1e-3 + 0.5 * torch.rand(1, steps, H, D // 2, generator=g, device=device))
    th = torch.randn(1, steps, H, D // 2, generator=g, device=device)
    auto = pieces_for(1, steps, H, D // 2, device, backend)
    if dry_run:
        auto = 4  # (the CPU never splits by itself: rehearse the split)

    def way(pieces):
        def scan(*leaves):
            with time_split(pieces):
                return complex_scan(*leaves, backend=backend, check_values=False)[0]
        return scan
    return ((x, ld, th), [(f"{name}, split in time (auto: {auto} pieces)", way(auto), {"pieces": auto}),
                          (f"{name}, one pass", way(1), {"pieces": 1})],
            dict(shape=f"1x{steps}x{H}x{D}", dtype="bfloat16", mode="dependent"))


def run(ctx: CheckContext, backend: str, name: str) -> None:
    """Both ways, forward and forward+backward, as ``scan speed`` rows (``ways``)."""
    time_ways(ctx, *ways(ctx.device, ctx.dry_run, backend, name))
