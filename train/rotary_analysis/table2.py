"""The seed's Table 2 (keys): `table2(result, radii)` from an analysis, its markdown, and the seed's own rows.

Per outlier radius r (an outlier is a feature with |k̄_i| > r): `ub_recall` = share of outliers under the upper
bound (15); `lb_recall` = share under it with φ above the lower bound (16); `lb_relaxed_recall` = the same with
the bound lowered by 0.1 rad. `pct_rof` is the share of all features under the upper bound and `mean_lb` the
mean lower bound π + p_max θ/2 over those features.
"""
from __future__ import annotations

import math

import torch

from .features import RotaryAnalysis

DEFAULT_RADII = (6.0, 9.0, 12.0)

# The seed's Table 2 (keys): name -> (features, %ROF, mean LB, {radius: (outliers, UB, LB, LB−0.1)}).
SEED_TABLE2 = {
    "Phi-1": (12288, 31, 3.93, {6: (634, 0.97, 0.88, 0.94), 9: (252, 0.99, 0.94, 0.98), 12: (46, 1.00, 1.00, 1.00)}),
    "Llama-2-7b": (65536, 28, 4.19, {6: (1242, 0.95, 0.72, 0.84), 9: (730, 1.00, 0.79, 0.94),
                                     12: (180, 1.00, 0.79, 0.96)}),
    "DeepSeek-V2-Lite": (13824, 28, 4.26, {6: (640, 0.92, 0.66, 0.84), 9: (464, 1.00, 0.68, 0.94),
                                           12: (352, 1.00, 0.74, 0.97)}),
}


def _share(mask: torch.Tensor) -> float | None:
    return None if mask.numel() == 0 else float(mask.double().mean())


def table2(result: RotaryAnalysis, radii=DEFAULT_RADII) -> dict:
    """The seed's Table 2 for keys: `n_features`, `pct_rof`, `mean_lb` and one row per radius."""
    under = result.under_upper_bound
    rows = []
    for r in radii:
        outlier = result.radius_k > float(r)
        rows.append({
            "radius": float(r),
            "outliers": int(outlier.sum()),
            "ub_recall": _share(under[outlier]),
            "lb_recall": _share(result.meets_lower_bound[outlier]),
            "lb_relaxed_recall": _share(result.meets_relaxed_lower_bound[outlier]),
        })
    mean_lb = float(result.lower_bound[under].mean()) if bool(under.any()) else None
    return {
        "n_features": result.n_features,
        "pct_rof": 100.0 * float(under.double().mean()),
        "mean_lb": None if mean_lb is None or math.isnan(mean_lb) else mean_lb,
        "n_definition_3_1": int(result.is_rof.sum()),
        "rows": rows,
    }


def _fmt(x, digits=2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table2_markdown(table: dict, name: str, *, with_seed: bool = True) -> str:
    """Table 2 in markdown: our rows for `name`, then the seed's Phi-1, Llama-2-7b and DeepSeek-V2-Lite rows."""
    lines = ["| Model | Features | %ROF | Mean LB | Radius | Outlier feat. | UB recall | LB / LB−0.1 recall |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for j, row in enumerate(table["rows"]):
        head = (f"| **{name}** (ours) | {table['n_features']} | {table['pct_rof']:.0f}% | {_fmt(table['mean_lb'])} "
                if j == 0 else "| | | | ")
        lines.append(head + f"| {row['radius']:g} | {row['outliers']} | {_fmt(row['ub_recall'])} | "
                     f"{_fmt(row['lb_recall'])} / {_fmt(row['lb_relaxed_recall'])} |")
    if with_seed:
        for seed_name, (n, pct, mean_lb, rows) in SEED_TABLE2.items():
            for j, (r, (count, ub, lb, lbr)) in enumerate(rows.items()):
                head = f"| {seed_name} (seed) | {n} | {pct}% | {mean_lb:.2f} " if j == 0 else "| | | | "
                lines.append(head + f"| {r} | {count} | {ub:.2f} | {lb:.2f} / {lbr:.2f} |")
    return "\n".join(lines)
