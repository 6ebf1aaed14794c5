"""Metrics as JSON lines (`<out>/metrics.jsonl`) and a loss-curve PNG.

One record per line, each with a `step`: training records `{"step", "loss", "lr", "tokens_per_s", ...}`,
evaluation records `{"step", "val_loss", "val_bpb", ...}`; any extra keys are kept. Values with `.item()`
(tensors, numpy scalars) are stored as numbers; non-finite floats are written as `NaN`/`Infinity`, which
Python's `json` reads back. A fresh run truncates the file. A run resumed from step `S` keeps the records with
`step <= S` (rewritten atomically; an unreadable torn last line is dropped) and appends after them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "read_metrics", "plot_loss_curve", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"


def _plain(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"metrics: cannot write a {type(x).__name__} as JSON")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics file, skipping lines that do not parse (a write cut off by a crash)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


class MetricsLogger:
    """Appends one JSON record per `log` call to `<out_dir>/metrics.jsonl`, flushed at once."""

    def __init__(self, out_dir: str | os.PathLike, *, resume_step: int | None = None):
        self.path = Path(out_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.kept: list[dict] = []  # the records a resumed run keeps from before its checkpoint
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            keep = self.kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r, default=_plain) + "\n" for r in keep), encoding="utf-8")
            os.replace(tmp, self.path)
        self._f = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, **values: Any) -> dict:
        """Write `{"step": step, **values}`; returns the record."""
        record = {"step": int(step), **values}
        self._f.write(json.dumps(record, default=_plain) + "\n")
        self._f.flush()
        return record

    def log_train(self, step: int, *, loss: float | None, lr: float, tokens_per_s: float, **extra: Any) -> dict:
        """``loss`` None: every step since the last record was skipped (non-finite), the record has none."""
        values = {"loss": loss} if loss is not None else {}
        return self.log(step, **values, lr=lr, tokens_per_s=tokens_per_s, **extra)

    def log_eval(self, step: int, *, val_loss: float, val_bpb: float, **extra: Any) -> dict:
        return self.log(step, val_loss=val_loss, val_bpb=val_bpb, **extra)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def plot_loss_curve(metrics_path: str | os.PathLike, png_path: str | os.PathLike) -> Path:
    """Train loss (line) and validation loss (markers) against step, as a PNG; returns `png_path`.

    Uses matplotlib's Agg canvas directly, so the global pyplot backend is left alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    valid = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1.0)
    if valid:
        ax.plot(*zip(*valid), "o-", label="val loss", markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(Path(metrics_path).parent.name or "loss")
    ax.grid(True, alpha=0.3)
    if train or valid:
        ax.legend()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, format="png")
    return png_path
