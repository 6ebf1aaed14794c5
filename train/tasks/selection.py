"""Which learning rate of a suite's grid a report keeps, per task and model: the best on validation (past the
training lengths first, where a task has it)."""
from __future__ import annotations

import math

from ..suite import mean_std

__all__ = ["selection_key", "summarise"]


def selection_key(metrics: list[dict]) -> tuple[float, ...]:
    """How one rate's seeds rank (smaller is better): the mean long-validation accuracy (``valid_long_accuracy``,
    sequences twice the longest training length; tasks that have it), then the mean validation accuracy at the
    training lengths, then the long and the short validation losses. A NaN ranks last."""
    def mean(name: str, sign: float) -> float:
        value, _ = mean_std(m[name] for m in metrics)
        return sign * value if math.isfinite(value) else math.inf

    names = ["valid_long_accuracy", "valid_accuracy", "valid_long_loss", "valid_loss"]
    present = [n for n in names if all(n in m for m in metrics)]
    return tuple(mean(n, -1.0 if n.endswith("accuracy") else 1.0) for n in present)


def _best_lrs(records: list[dict]) -> list[float]:
    """The learning rates whose seeds rank best by `selection_key`. An exact tie on every term (say, accuracy 1.0
    and loss 0.0 in float32 for two rates) keeps every tied rate: validation cannot choose between them, so the
    report shows each rather than one picked by the order of the grid."""
    by_lr: dict[float, list[dict]] = {}
    for r in records:
        by_lr.setdefault(r["config"]["lr"], []).append(r["metrics"])

    def key(lr):
        return selection_key(by_lr[lr])

    keys = {lr: key(lr) for lr in by_lr}
    best = min(keys.values())
    return sorted(lr for lr, k in keys.items() if k == best)


def summarise(records: list[dict]) -> dict:
    """{task_label: {model: [{"lr", "records", "tied"}, …]}}: the best learning rate's records per model, one
    entry per rate when several tie exactly on validation."""
    grouped: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        grouped.setdefault(r["config"]["task_label"], {}).setdefault(r["model"], []).append(r)
    out = {}
    for task_label, models in grouped.items():
        out[task_label] = {}
        for model, recs in models.items():
            lrs = _best_lrs(recs)
            out[task_label][model] = [{"lr": lr, "records": [r for r in recs if r["config"]["lr"] == lr],
                                       "tied": len(lrs) > 1} for lr in lrs]
    return out
