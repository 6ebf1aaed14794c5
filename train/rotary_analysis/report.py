"""Writing an analysis: `summary.json` (the documented schema), `report.md` (Table 2 beside the seed's rows).

summary.json (version 1):

    schema_version  1
    model           the analysed model's name or path
    tokens          tokens read (per layer)
    p_max           context length: our run's seq_len, the HF config's max_position_embeddings, or --p-max
    layer_p_max     the p_max each analysed layer's bounds and Definition 3.1 use: p_max, or min(p_max, window)
                    for a layer with a sliding window (its queries see no key further back)
    windows         each analysed layer's sliding window (null: global attention)
    head_dim, rotary_dim, n_heads, n_kv_heads, n_layers   shapes (n_layers = analysed attention layers)
    layout          "interleaved" or "half" (the model's own pair order)
    theta_kind      "static" (θ_i after scaling) or "effective" (CARoPE: mean per-token phase increment)
    layers          the model's block index of each analysed layer
    table2          {n_features, pct_rof, mean_lb, n_definition_3_1, rows: [{radius, outliers, ub_recall,
                    lb_recall, lb_relaxed_recall}]}   (recalls are null when there is no outlier)
    features        one entry per (layer, head, pair):
                    {layer, head, pair, theta, q_mean: [x0, x1], k_mean: [x0, x1], radius_q, radius_k,
                     phi (rad, in (0, 2π]), is_rof (Definition 3.1), under_upper_bound, lower_bound
                     (π + p_max θ / 2, with the layer's p_max), meets_lower_bound, meets_relaxed_lower_bound,
                     angle_std (keys), angle_std_q}
    notes           free-text caveats from the adapter (e.g. CARoPE)

`layer` in features is the model's block index; `head` the query head (keys of GQA/MQA repeated); `pair` i
rotates with θ_i. Per-channel statistics (mean / max |q|, |k| before and after rotation) are in
`channels.npz`, arrays `{q,k}_{mean_abs,max_abs,mean_abs_rotated,max_abs_rotated}` shaped
`(n_layers, heads, head_dim)` in the model's channel order.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .features import RotaryAnalysis
from .table2 import DEFAULT_RADII, table2, table2_markdown

SCHEMA_VERSION = 1


def _num(x: float):
    x = float(x)
    return None if math.isnan(x) else (x if math.isfinite(x) else ("inf" if x > 0 else "-inf"))


def summary_dict(result: RotaryAnalysis, *, model: str, radii=DEFAULT_RADII, notes: list[str] | None = None) -> dict:
    """The summary.json content as a dict."""
    L, H, P = result.phi.shape
    features = []
    radius_q, radius_k = result.radius_q, result.radius_k
    for li in range(L):
        for h in range(H):
            for i in range(P):
                features.append({
                    "layer": result.layers[li], "head": h, "pair": i,
                    "theta": float(result.theta[li, h, i]),
                    "q_mean": [float(v) for v in result.q_mean[li, h, i]],
                    "k_mean": [float(v) for v in result.k_mean[li, h, i]],
                    "radius_q": float(radius_q[li, h, i]), "radius_k": float(radius_k[li, h, i]),
                    "phi": float(result.phi[li, h, i]),
                    "is_rof": bool(result.is_rof[li, h, i]),
                    "under_upper_bound": bool(result.under_upper_bound[li, h, i]),
                    "lower_bound": float(result.lower_bound[li, h, i]),
                    "meets_lower_bound": bool(result.meets_lower_bound[li, h, i]),
                    "meets_relaxed_lower_bound": bool(result.meets_relaxed_lower_bound[li, h, i]),
                    "angle_std": _num(result.angle_std_k[li, h, i]),
                    "angle_std_q": _num(result.angle_std_q[li, h, i]),
                })
    return {
        "schema_version": SCHEMA_VERSION, "model": model, "tokens": result.tokens, "p_max": result.p_max,
        "layer_p_max": list(result.layer_p_max), "windows": list(result.windows),
        "head_dim": result.head_dim, "rotary_dim": result.rotary_dim, "n_heads": H,
        "n_kv_heads": result.n_kv_heads, "n_layers": L, "layout": result.layout,
        "theta_kind": "effective" if result.theta_is_effective else "static", "layers": list(result.layers),
        "table2": table2(result, radii), "features": features, "notes": list(notes or []),
    }


def p_max_text(summary: dict) -> str:
    """The p_max the bounds used, e.g. "p_max = 32 (8 in layers 1, 3: their sliding window)"."""
    text = f"p_max = {summary['p_max']}"
    by_value: dict[int, list[int]] = {}
    for layer, pm in zip(summary["layers"], summary.get("layer_p_max", [])):
        if pm != summary["p_max"]:
            by_value.setdefault(pm, []).append(layer)
    if by_value:
        text += " (" + "; ".join(f"{pm} in layer{'s' * (len(ls) > 1)} {', '.join(map(str, ls))}"
                                 for pm, ls in by_value.items()) + ": their sliding window)"
    return text


def report_markdown(summary: dict, figures: dict[str, str]) -> str:
    """report.md: what was analysed, Table 2 beside the seed's rows, Definition 3.1 counts and the figures."""
    t = summary["table2"]
    lines = [
        f"# Rotary offset features: {summary['model']}",
        "",
        f"{summary['tokens']:,} tokens; {summary['n_layers']} attention layers × {summary['n_heads']} heads "
        f"({summary['n_kv_heads']} kv heads) × {summary['rotary_dim'] // 2} rotary pairs "
        f"(head_dim {summary['head_dim']}, rotary_dim {summary['rotary_dim']}, {summary['layout']} layout); "
        f"{p_max_text(summary)}; θ {summary['theta_kind']}.",
        "",
        "## Table 2 (keys)",
        "",
        table2_markdown(t, summary["model"]),
        "",
        f"Features meeting Definition 3.1 exactly (d_i(p) < d_i(0) for all integer 0 < p ≤ the layer's p_max): "
        f"{t['n_definition_3_1']} of {t['n_features']}.",
        "An outlier feature has key radius |k̄_i| > r. LB recall counts outliers under the upper bound whose angle "
        "φ_i exceeds π + p_max θ_i / 2 (the layer's p_max; relaxed: minus 0.1 rad). The seed's rows are copied "
        "from its Table 2.",
    ]
    for note in summary.get("notes", []):
        lines += ["", f"Note: {note}"]
    if figures:
        lines += ["", "## Figures", ""]
        for title, path in figures.items():
            lines += [f"### {title}", "", f"![{title}]({path})", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_outputs(result: RotaryAnalysis, out_dir, *, model: str, radii=DEFAULT_RADII,
                  notes: list[str] | None = None, figures: bool = True, head=None) -> dict:
    """Write summary.json, channels.npz, the figures (PNG) and report.md into out_dir; return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summary_dict(result, model=model, radii=radii, notes=notes)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    np.savez_compressed(out / "channels.npz", **{f"{name}_{key}": v.numpy() for name, d in result.channels.items()
                                                 for key, v in d.items()})
    written = {}
    if figures:
        from .figures import write_figures

        written = write_figures(result, out, head=head)
    (out / "report.md").write_text(report_markdown(summary, written))
    return summary
