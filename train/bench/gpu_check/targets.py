"""The issue's targets, read off the measured rows: each with what was measured and whether it was met
(None when the row that decides it was not measured)."""
from __future__ import annotations

import re

from .part_scan import DEFAULT, ours_name
from .step_split import ceiling_at

MAIN_SHAPE = "8x8192x16x128"


def _one(rows, section, **match):
    for r in rows:
        if r.get("section") == section and "skipped" not in r and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def _shown(value: float, threshold: float, fmt: str) -> str:
    """``value`` in ``fmt`` (one ``{:.Nf}`` field), with more decimals while the shown number would fall on the
    other side of ``threshold`` than the value (79.6 % read "80 %" against "≥ 80 %", 1.1496× read "1.15×")."""
    decimals = int(re.search(r"\.(\d+)f", fmt).group(1))
    for more in range(6):
        text = fmt.replace(f".{decimals}f", f".{decimals + more}f").format(value)
        if (float(re.sub(r"[^0-9.+-]", "", text)) >= threshold) == (value >= threshold):
            break
    return text


def _target(name, value, threshold, fmt="{:.2f}", higher=True, note=None):
    """``note``: said after the measured value (the ratio that bounds it, say)."""
    if value is None:
        return {"target": name, "measured": "not measured", "met": None}
    met = value >= threshold if higher else value <= threshold
    shown = _shown(value, threshold, fmt) if higher else fmt.format(value)
    return {"target": name, "measured": shown + (f" ({note})" if note else ""), "met": met}


def _ceiling_note(rows, T):
    """The ratio a model with free mixers would reach at ``T`` (eager, padded; ``step_split``), or None."""
    ceiling = ceiling_at(rows, T)
    return None if ceiling is None else f"ceiling {ceiling:.2f}×: mixers that cost nothing"


_OURS = ours_name("triton", *DEFAULT)  # the Triton scan at its default layout and stages


def _ours_default(rows, **match):
    """The default kernel setting's row, or None: the speed users get."""
    r = _one(rows, "scan speed", impl=_OURS, **match)
    return r if r and r.get("pct_copy") else None


def _scan_pct(rows, passes):
    r = _ours_default(rows, shape=MAIN_SHAPE, dtype="bfloat16", mode="dependent", passes=passes)
    return r.get("pct_copy") if r else None


def _speedup(rows, section, key, model, **match):
    ours, base = _one(rows, section, model=model, **match), _one(rows, section, model="transformer", **match)
    if ours and base and ours.get(key) and base.get(key):
        return ours[key] / base[key]
    return None


def evaluate(rows: list[dict]) -> list[dict]:
    acc = None
    ours_fp32 = _ours_default(rows, shape=MAIN_SHAPE, dtype="float32", mode="dependent", passes="fwd+bwd")
    theirs = [r for r in rows if r.get("impl") == "accelerated-scan" and r.get("passes") == "fwd+bwd" and r.get("ms")]
    if ours_fp32 and ours_fp32.get("ms") and theirs:
        acc = theirs[0]["ms"] / ours_fp32["ms"]
    syncs = [r["syncs_per_step"] for r in rows if r.get("section") == "syncs" and "syncs_per_step" in r]
    return [
        _target("scan forward ≥ 80 % of copy bandwidth (bf16, data-dependent, B8·T8192·H16·D128; default layout)",
                _scan_pct(rows, "fwd"), 80, "{:.0f} %"),
        _target("scan forward+backward ≥ 60 % of copy bandwidth", _scan_pct(rows, "fwd+bwd"), 60, "{:.0f} %"),
        _target("scan ≥ 2× accelerated-scan's complex scan (fp32 fwd+bwd, same bytes)", acc, 2.0, "{:.2f}×"),
        _target("hybrid training ≥ 1.15× the Transformer's tokens/s at 8K (eager, padded)",
                _speedup(rows, "models", "tokens_per_s", "hybrid", T=8192, batch="padded", execution="eager"), 1.15,
                "{:.2f}×", note=_ceiling_note(rows, 8192)),
        _target("hybrid training ≥ 2× the Transformer's tokens/s at 16K (eager, padded)",
                _speedup(rows, "models", "tokens_per_s", "hybrid", T=16384, batch="padded", execution="eager"), 2.0,
                "{:.2f}×", note=_ceiling_note(rows, 16384)),
        _target("decoding ≥ 5× the Transformer's tokens/s at 16K, batch 16 (eager steps)",
                _speedup(rows, "decoding", "tokens_per_s", "hybrid", context=16384, batch=16, step="eager"), 5.0,
                "{:.2f}×"),
        _target("decoding ≥ 5× the Transformer's tokens/s at 16K, batch 16 (both replayed from CUDA graphs)",
                _speedup(rows, "decoding", "tokens_per_s", "hybrid", context=16384, batch=16, step="graphed"), 5.0,
                "{:.2f}×"),
        _target("decoding ≥ 5× the Transformer's tokens/s at 16K, batch 16 (both replayed from CUDA graphs of the "
                "compiled step)", _speedup(rows, "decoding", "tokens_per_s", "hybrid", context=16384, batch=16,
                                           step="graphed-compiled"), 5.0, "{:.2f}×"),
        _target("no host sync in a training step (worst of padded / packed; R static / selective, A, M, G)",
                max(syncs) if syncs else None, 0, "{:.0f} syncs", higher=False),
    ]
