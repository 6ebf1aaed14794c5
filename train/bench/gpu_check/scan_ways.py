"""One scan timed several ways on the same inputs (``scan_packed_rows``, ``scan_long_row``): each way forward and
forward+backward, a ``scan speed`` row each, in milliseconds (the ways move the same bytes, or the row says why
not)."""
from __future__ import annotations

import torch

from .context import CheckContext, median_time


def time_ways(ctx: CheckContext, leaves: tuple, ways: list, label: dict) -> None:
    """``ways``: ``(impl, scan, extra)``, ``scan(x, log_decay, theta) -> y`` the way's call and ``extra`` the fields its
    rows add; ``leaves`` the (x, log_decay, theta) they share; ``label`` the rows' shape, dtype and mode."""
    for impl, scan, extra in ways:
        for passes in ("fwd", "fwd+bwd"):
            if not ctx.has_time(15, "scan speed", f"{impl} {passes}"):
                return
            grad = passes != "fwd"
            ts = [t.detach().requires_grad_(grad) for t in leaves]
            up = torch.randn_like(ts[0])

            def fn():
                with torch.set_grad_enabled(grad):
                    y = scan(*ts)
                    return torch.autograd.grad(y, ts, up) if grad else y
            try:
                ms = median_time(fn, ctx, reps=1 if ctx.dry_run else 3, warmup=1)
            except Exception as exc:  # noqa: BLE001 - a failing row is reported, the part goes on
                ctx.record("scan speed", **label, impl=impl, passes=passes, error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            ctx.record("scan speed", **label, impl=impl, passes=passes, ms=ms, **extra)
