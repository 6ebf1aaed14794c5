"""Report pieces: markdown tables, mean ± std over seeds, and line plots saved as PNG (matplotlib, Agg).

    rows = [["vo-rnn", fmt_mean_std([0.99, 1.0])], …]
    text = markdown_table(["model", "acc@256"], rows)
    plot_lines("acc.png", {"vo-rnn": ([40, 64], [1.0, 0.99], [0.0, 0.01])}, xlabel="length", ylabel="accuracy")
    write_report("runs/synth/report.md", "# Synthetic suite", [text, "![acc](acc.png)"])
"""
from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the non-interactive backend)


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value; NaN for none) of the finite values."""
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def fmt_mean_std(values, digits: int = 3) -> str:
    """``"0.912 ± 0.004"``, ``"0.912"`` for one value, ``"–"`` for none."""
    n = sum(1 for v in values if v is not None and math.isfinite(float(v)))
    mean, std = mean_std(values)
    if n == 0:
        return "–"
    return f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def is_tie(a, b) -> bool:
    """True when the means of two seed lists differ by less than the larger spread (the report reads a tie)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    return abs(ma - mb) < max(sa, sb)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def plot_lines(path, series: dict, *, xlabel: str, ylabel: str, title: str | None = None, logx: bool = False,
               hline: float | None = None) -> Path:
    """One line per label: ``series[label] = (xs, ys)`` or ``(xs, ys, errors)`` (error bars). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    try:
        for label, data in series.items():
            xs, ys = data[0], data[1]
            errors = data[2] if len(data) > 2 else None
            ax.errorbar(xs, ys, yerr=errors, marker="o", markersize=3, capsize=2, label=label)
        if hline is not None:
            ax.axhline(hline, color="grey", linestyle=":", linewidth=1, label="chance")
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return path


def save_figure(fig, path: Path) -> None:
    """Write ``fig`` as a PNG at ``path`` atomically (a temporary file, then a rename): a reader never sees a
    half-written image."""
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)


def write_report(path, title: str, sections: list[str]) -> Path:
    """``title`` then the sections, separated by blank lines, written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n\n".join([title, *sections]).rstrip() + "\n")
    os.replace(tmp, path)
    return path
