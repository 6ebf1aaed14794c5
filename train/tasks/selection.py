"""Which learning rate of a suite's grid a report keeps, per task and model: the best on validation."""
from __future__ import annotations

import math

from ..suite import mean_std

__all__ = ["summarise"]


def _best_lrs(records: list[dict]) -> list[float]:
    """The learning rates whose seeds have the best mean validation accuracy (then the lower validation loss).
    An exact tie (say, accuracy 1.0 and loss 0.0 in float32 for two rates) keeps every tied rate: validation
    cannot choose between them, so the report shows each rather than one picked by the order of the grid."""
    by_lr: dict[float, list[dict]] = {}
    for r in records:
        by_lr.setdefault(r["config"]["lr"], []).append(r["metrics"])

    def key(lr):
        acc, _ = mean_std(m["valid_accuracy"] for m in by_lr[lr])
        loss, _ = mean_std(m["valid_loss"] for m in by_lr[lr])
        return (-(acc if math.isfinite(acc) else -1.0), loss if math.isfinite(loss) else math.inf)

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
