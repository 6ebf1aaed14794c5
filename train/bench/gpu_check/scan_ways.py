"""One scan timed several ways on the same inputs (``scan_packed_rows``, ``scan_long_row``): each way forward and
forward+backward, a ``scan speed`` row each, in milliseconds (the ways move the same bytes, or the row says why
not)."""
from __future__ import annotations

import torch

from .context import CheckContext, median_time


def scan_fn(impl, x, ld, th, passes: str):
    """A call of ``impl(x, ld, th) -> y`` as a speed row times it: "fwd" without gradients, "fwd+bwd" with the
    gradients of the three (which must require them) for a fixed upstream gradient."""
    if passes == "fwd":
        def fn():
            with torch.no_grad():
                return impl(x, ld, th)
        return fn
    up = torch.randn_like(x)

    def fn():
        y = impl(x, ld, th)
        return torch.autograd.grad(y, (x, ld, th), up)
    return fn


def with_grad(leaves: tuple, passes: str) -> list:
    """``leaves`` detached, requiring gradients for "fwd+bwd"."""
    return [t.detach().requires_grad_(passes != "fwd") for t in leaves]


def time_ways(ctx: CheckContext, leaves: tuple, ways: list, label: dict) -> None:
    """``ways``: ``(impl, scan, extra)``, ``scan(x, log_decay, theta) -> y`` the way's call and ``extra`` the fields its
    rows add; ``leaves`` the (x, log_decay, theta) they share; ``label`` the rows' shape, dtype and mode."""
    for impl, scan, extra in ways:
        for passes in ("fwd", "fwd+bwd"):
            if not ctx.has_time(15, "scan speed", f"{impl} {passes}"):
                return
            fn = scan_fn(scan, *with_grad(leaves, passes), passes)
            try:
                ms = median_time(fn, ctx, reps=1 if ctx.dry_run else 3, warmup=1)
            except Exception as exc:  # noqa: BLE001 - a failing row is reported, the part goes on
                ctx.record("scan speed", **label, impl=impl, passes=passes, error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            ctx.record("scan speed", **label, impl=impl, passes=passes, ms=ms, **extra)
