"""Where the Transformer's training step goes, read off the models part's rows, and the ratio that bounds every
other model's: ``ceilings(rows)``.

At a fixed number of tokens a step, causal attention's work grows with the sequence length T and everything
else (the projections and MLPs, the norms, the loss, the optimizer) does not. So a step's time per token is
``fixed + per_t · T``, fitted by least squares to the Transformer's rows of one execution and batch at two or
more lengths. A model at the same non-embedding size whose mixers cost nothing, the rest of its step costing
what the Transformer's does, would reach ``(fixed + per_t · T) / fixed`` times the Transformer's tokens/s: the
**ceiling** of the "hybrid ≥ N× the Transformer" targets at that length. A hybrid's measured ratio over that
ceiling is the share of the reachable gain it took; what is left of its step is ``fixed`` plus its mixers.
"""
from __future__ import annotations

__all__ = ["ceilings", "ceiling_at"]


def _fit(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """Least squares ``seconds per token = fixed + per_t · T`` over (T, seconds per token) points with at least two
    lengths: (fixed, per_t, the largest residual over the fitted value)."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    per_t = sum((t - mean_t) * (s - mean_s) for t, s in points) / var_t
    fixed = mean_s - per_t * mean_t
    residual = max(abs(s - (fixed + per_t * t)) / (fixed + per_t * t) for t, s in points)
    return fixed, per_t, residual


def _per_token_s(row: dict) -> float:
    return 1.0 / row["tokens_per_s"]


def ceilings(rows: list[dict], model: str = "hybrid") -> list[dict]:
    """One dict per measured Transformer row whose (execution, batch) has rows at two or more lengths: its T, the
    step's milliseconds and the fitted part of them that does not grow with T, the ceiling at T, and ``model``'s
    measured ratio at T with its share of the ceiling (None where ``model`` has no row). A fit whose fixed part is
    not positive (attention not the only thing growing with T, or noise) gives ``ceiling`` None."""
    measured = [r for r in rows if r.get("section") == "models" and "skipped" not in r and r.get("tokens_per_s")]
    out = []
    for execution, batch in sorted({(r["execution"], r["batch"]) for r in measured}):
        group = [r for r in measured if (r["execution"], r["batch"]) == (execution, batch)]
        base = sorted((r for r in group if r["model"] == "transformer"), key=lambda r: r["T"])
        if len({r["T"] for r in base}) < 2:
            continue
        fixed, per_t, residual = _fit([(r["T"], _per_token_s(r)) for r in base])
        ours = {r["T"]: r for r in group if r["model"] == model}
        for r in base:
            tokens = r["B"] * r["T"]  # a step's
            ceiling = _per_token_s(r) / fixed if fixed > 0 else None
            ratio = ours[r["T"]]["tokens_per_s"] / r["tokens_per_s"] if r["T"] in ours else None
            out.append({"execution": execution, "batch": batch, "T": r["T"], "step_ms": r["step_ms"],
                        "fixed_ms": fixed * tokens * 1e3 if fixed > 0 else None,
                        "attention_ms": per_t * r["T"] * tokens * 1e3, "fit_residual": residual,
                        "ceiling": ceiling, "model": model, "ratio": ratio,
                        "share_of_ceiling": (ratio - 1) / (ceiling - 1) if ratio and ceiling and ceiling > 1 else None})
    return out


def ceiling_at(rows: list[dict], T: int, execution: str = "eager", batch: str = "padded") -> float | None:
    """The ceiling at ``T`` for that execution and batch (``ceilings``), or None where it cannot be fitted."""
    for c in ceilings(rows):
        if (c["T"], c["execution"], c["batch"]) == (T, execution, batch):
            return c["ceiling"]
    return None
