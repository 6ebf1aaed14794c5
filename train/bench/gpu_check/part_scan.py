"""Part 3, the scan's speed: ``complex_scan`` (Triton) forward and forward+backward at B8·T8192·H16·D128, bf16 and
fp32, at the default setting of its kernels (the "runs" layout, ``triton_runs``, its loop pipelined over 3 stages;
bf16 with data-dependent decay also the earlier default, the "tile" layout; ``EXPLORE`` names further settings),
against a device copy of the same bytes (the bandwidth ceiling, measured in the same run), accelerated-scan's
complex scan, fla's HGRN scans (real decay, θ = 0) and the torch backend under ``torch.compile`` (last: its
compile takes a minute). First of all, because no GPU has run them yet, a training batch packed by documents,
scanned as one row and as a row per window (``scan_packed_rows``), and one long row in one pass and split in time
(``scan_long_row``).

Bytes are what each op must at least move, each input read once and each output written once:
forward ``x + log_decay + theta`` read, ``y + final state`` written; forward+backward adds ``dy`` read and
``dx, dlog_decay, dtheta`` written, with x, log_decay and theta read again (the backward recomputes the states
from float32 checkpoints, which are counted too). GB/s = bytes / median time; "% copy" = GB/s over the copy's
(bytes read + written) GB/s on the same tensor size.
"""
from __future__ import annotations

import contextlib
import math

import torch

from . import scan_long_row, scan_packed_rows
from .context import CheckContext, median_time
from .scan_ways import scan_fn

CK_INTERVAL = 64  # the checkpoint spacing counted (the tuned kernels use 32–128)


SHAPE = (8, 8192, 16, 128)  # B, T, H, D of every speed row (the dry run's: (1, 24, 2, 8))


def _shape(ctx):
    return (1, 24, 2, 8) if ctx.dry_run else SHAPE


def _inputs(shape, dtype, mode, device, grad=False):
    B, T, H, D = shape
    P = D // 2
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(B, T, H, D, generator=g, device=device).to(dtype)
    dep = (B, T, H, P)
    ld = -(1e-3 + 0.5 * torch.rand(dep if mode in ("dependent", "real") else (H, P), generator=g, device=device))
    th = torch.randn((H, P) if mode == "static" else dep, generator=g, device=device) if mode != "real" else \
        torch.zeros(dep, device=device)
    for t in (x, ld, th):
        t.requires_grad_(grad)
    return x, ld, th


def _bytes(x, ld, th, passes: str) -> int:
    B, T, H, D = x.shape
    xb = x.numel() * x.element_size()
    gates = (ld.numel() + th.numel()) * 4
    final = B * H * D * 4
    ck = B * H * D * 4 * math.ceil(T / CK_INTERVAL)
    forward = 2 * xb + gates + final
    if passes == "fwd":
        return forward
    backward = xb + xb + gates + ck + xb + gates  # x, dy, gates, checkpoints in; dx, dgates out
    return forward + ck + backward


# The kernel settings timed, as (layout, stages). The default at every dtype and decay; the earlier default (the
# tile layout, whose other rows two sessions measured) beside it at bf16 with data-dependent decay.
DEFAULT = ("runs", 3)
BASELINE = ("tile", 1)
# Settings timed after the other libraries' rows, for a tuning question. The runs loop at 4 and 2 stages answered
# theirs on the H100 (2026-11-28: 72.6 % and 70.9 % of copy forward against 73.9 % at 3; docs/research/gpu.md), so
# none is timed now: the part's time goes to the compiled torch backend, last, which asks for 90 s of it.
EXPLORE: tuple = ()


def _ours(backend):
    from hybrid.kernels import complex_scan

    def run(x, ld, th):
        return complex_scan(x, ld, th, backend=backend, check_values=False)[0]
    return run


def _chosen_tiles(setting, passes) -> str:
    """The autotuner's pick for the last launch of each pass of a setting, e.g. ``fwd S4 R8 BP16 w2``: which
    tiles win on this GPU (the next candidate lists and defaults follow them). Empty where nothing was tuned."""
    from hybrid.kernels.complex_scan.triton_scan import tuned_kernel

    layout, stages = setting
    picks = []
    for which in ("fwd",) if passes == "fwd" else ("fwd", "bwd"):
        config = getattr(tuned_kernel(layout, which, stages), "best_config", None)
        if config is not None:
            tile = " ".join(f"{k}{v}" for k, v in config.kwargs.items() if k != "STAGES")
            picks.append(f"{which} {tile} w{config.num_warps}")
    return ", ".join(picks)


def _within(setting):
    """The timed function runs, forward and backward, inside ``scan_layout`` (the backward reads the stages
    when autograd calls it)."""
    from hybrid.kernels.complex_scan.triton_scan import scan_layout

    layout, stages = setting
    return lambda: scan_layout(layout, stages=stages)


def _compiled_torch():
    from hybrid.kernels import complex_scan

    @torch.compile(dynamic=False)
    def f(x, ld, th):
        return complex_scan(x, ld, th, backend="torch", check_values=False)[0]
    return f


def _record_copy(ctx, x, label):
    xd = x.detach()
    ms = median_time(lambda: torch.empty_like(xd).copy_(xd), ctx, reps=3 if ctx.dry_run else 20)
    gbs = 2 * xd.numel() * xd.element_size() / ms / 1e6
    ctx.record("scan speed", **label, impl="copy", passes="copy", ms=ms, gb_s=gbs, pct_copy=100.0)
    return gbs


def _time_impl(ctx, name, impl, shape, dtype, mode, copy_gbs, label, within=contextlib.nullcontext, setting=None):
    for passes in ("fwd", "fwd+bwd"):
        if not ctx.has_time(15, "scan speed", f"{name} {passes} {label}"):
            return
        try:
            x, ld, th = _inputs(shape, dtype, mode, ctx.device, grad=passes != "fwd")
            fn = scan_fn(impl, x, ld, th, passes)

            def timed():
                with within():
                    return fn()
            ms = median_time(timed, ctx, reps=1 if ctx.dry_run else 3, warmup=1)
        except Exception as exc:  # noqa: BLE001 - a failing comparison is reported, the part goes on
            ctx.record("scan speed", **label, impl=name, passes=passes, error=f"{type(exc).__name__}: {exc}"[:300])
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        gbs = _bytes(x, ld, th, passes) / ms / 1e6
        tiles = {"tiles": _chosen_tiles(setting, passes)} if setting is not None else {}
        ctx.record("scan speed", **label, impl=name, passes=passes, ms=ms, gb_s=gbs, pct_copy=100 * gbs / copy_gbs,
                   **tiles)


def _accelerated_scan(ctx, shape, copy_gbs):
    """accelerated-scan's complex scan on its own layout (channels, time) in complex64: no transpose counted."""
    try:
        from accelerated_scan.complex import scan
    except Exception as exc:  # noqa: BLE001 - absent, or broken against this torch / triton
        ctx.record("scan speed", skipped="accelerated-scan", reason=f"import failed: {type(exc).__name__}: {exc}"[:200])
        return
    B, T, H, D = shape
    C = H * D // 2
    label = dict(shape=f"{B}x{C}x{T} complex64", dtype="complex64", mode="dependent")
    for passes in ("fwd", "fwd+bwd"):
        if not ctx.has_time(15, "scan speed", f"accelerated-scan {passes}"):
            return
        g = torch.Generator(device=ctx.device).manual_seed(0)
        mag = torch.exp(-(1e-3 + 0.5 * torch.rand(B, C, T, generator=g, device=ctx.device)))
        ang = torch.randn(B, C, T, generator=g, device=ctx.device)
        forget = torch.polar(mag, ang).requires_grad_(passes != "fwd")
        inputs = torch.randn(B, C, T, dtype=torch.complex64, generator=g, device=ctx.device).requires_grad_(passes != "fwd")
        try:
            if passes == "fwd":
                def fn():
                    with torch.no_grad():
                        return scan(forget, inputs)
            else:
                up = torch.randn_like(inputs)

                def fn():
                    return torch.autograd.grad(scan(forget, inputs), (forget, inputs), up)
            ms = median_time(fn, ctx, reps=3)
        except Exception as exc:  # noqa: BLE001
            ctx.record("scan speed", **label, impl="accelerated-scan", passes=passes,
                       error=f"{type(exc).__name__}: {exc}"[:300])
            continue
        n = forget.numel() * 8
        nbytes = 3 * n if passes == "fwd" else 3 * n + 5 * n  # fwd: a, x in, s out; bwd: a, s, ds in, dx, da out
        gbs = nbytes / ms / 1e6
        ctx.record("scan speed", **label, impl="accelerated-scan", passes=passes, ms=ms, gb_s=gbs,
                   pct_copy=100 * gbs / copy_gbs)


def _fla_hgrn(ctx, shape, copy_gbs):
    """fla's HGRN scans, h_t = exp(g_t)·h_{t−1} + x_t over (B, T, H·D) real channels: the θ = 0 case."""
    try:
        from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn
    except Exception as exc:  # noqa: BLE001 - absent, or broken against this torch / triton
        ctx.record("scan speed", skipped="fla hgrn", reason=f"import failed: {type(exc).__name__}: {exc}"[:200])
        return
    B, T, H, D = shape
    for name, op in (("fla chunk_hgrn", chunk_hgrn), ("fla fused_recurrent_hgrn", fused_recurrent_hgrn)):
        for dtype in (torch.bfloat16, torch.float32):
            label = dict(shape=f"{B}x{T}x{H * D} real", dtype=str(dtype).replace("torch.", ""), mode="real")
            for passes in ("fwd", "fwd+bwd"):
                if not ctx.has_time(15, "scan speed", f"{name} {passes}"):
                    return
                g = torch.Generator(device=ctx.device).manual_seed(0)
                x = torch.randn(B, T, H * D, generator=g, device=ctx.device).to(dtype).requires_grad_(passes != "fwd")
                gate = (-(1e-3 + 0.5 * torch.rand(B, T, H * D, generator=g, device=ctx.device))).to(dtype)
                gate.requires_grad_(passes != "fwd")
                try:
                    if passes == "fwd":
                        def fn():
                            with torch.no_grad():
                                return op(x, gate)[0]
                    else:
                        up = torch.randn_like(x)

                        def fn():
                            return torch.autograd.grad(op(x, gate)[0], (x, gate), up)
                    ms = median_time(fn, ctx, reps=3)
                except Exception as exc:  # noqa: BLE001
                    ctx.record("scan speed", **label, impl=name, passes=passes,
                               error=f"{type(exc).__name__}: {exc}"[:300])
                    continue
                n = x.numel() * x.element_size()
                nbytes = 3 * n if passes == "fwd" else 3 * n + 5 * n
                gbs = nbytes / ms / 1e6
                ctx.record("scan speed", **label, impl=name, passes=passes, ms=ms, gb_s=gbs,
                           pct_copy=100 * gbs / copy_gbs)


def speed_rows() -> tuple[list, list]:
    """Our rows as ``(setting, dtype, mode, name suffix)``, in ``run``'s order: the default at every dtype and
    decay with the baseline second, then (after the other libraries) the explored settings."""
    bf16, f32 = torch.bfloat16, torch.float32
    first = [(DEFAULT, bf16, "dependent", ""), (BASELINE, bf16, "dependent", "")]
    first += [(DEFAULT, dtype, mode, "") for dtype, mode in ((bf16, "static"), (bf16, "mixed"), (f32, "dependent"))]
    first.append((DEFAULT, f32, "real", ", θ = 0"))
    return first, [(setting, bf16, "dependent", "") for setting in EXPLORE]


def run(ctx: CheckContext) -> None:
    shape = _shape(ctx)
    B, T, H, D = shape
    backend = "triton" if ctx.device.type == "cuda" or ctx.dry_run else "auto"
    copies = {}

    def time_setting(setting, dtype, mode, suffix=""):
        label = dict(shape=f"{B}x{T}x{H}x{D}", dtype=str(dtype).replace("torch.", ""), mode=mode)
        if dtype not in copies:
            copies[dtype] = _record_copy(ctx, _inputs(shape, dtype, "dependent", ctx.device)[0],
                                         {k: v for k, v in label.items() if k != "mode"})
        _time_impl(ctx, ours_name(backend, *setting) + suffix, _ours(backend), shape, dtype, mode, copies[dtype],
                   label, within=_within(setting), setting=setting)

    first, explored = speed_rows()
    # first the rows no GPU has run: they keep or revert the time split's default
    scan_packed_rows.run(ctx, backend, ours_name(backend, *DEFAULT))  # the trainer's packed batch, two ways
    scan_long_row.run(ctx, backend, ours_name(backend, *DEFAULT))  # one long row: split in time, one pass
    for row in first:
        time_setting(*row)
    if ctx.device.type == "cuda":
        _accelerated_scan(ctx, shape, copies[torch.float32])
        _fla_hgrn(ctx, shape, copies[torch.float32])
    for row in explored:
        time_setting(*row)
    if ctx.device.type == "cuda":
        # the compiled torch backend: only its speed on a GPU is of interest
        label = dict(shape=f"{B}x{T}x{H}x{D}", dtype="bfloat16", mode="dependent")
        if ctx.has_time(90, "scan speed", "torch backend, compiled"):
            _time_impl(ctx, "torch backend (compiled)", _compiled_torch(), shape, torch.bfloat16, "dependent",
                       copies[torch.bfloat16], label)


def ours_name(backend: str, layout: str, stages: int = 1) -> str:
    """``ours (triton, runs, 3 stages)``, ``ours (triton, tile)``. (In the reports of commit cfd699a and before,
    ``ours (triton)`` is the tile layout and ``ours (triton, runs)`` the runs layout's forward at 1 stage.)"""
    from hybrid.kernels.complex_scan.triton_scan import scan_setting

    return f"ours ({backend}, {scan_setting(layout, stages)})"
