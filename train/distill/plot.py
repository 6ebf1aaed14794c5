"""A distillation run's loss.png: stage 1's per-layer alignment MSE, stage 2's loss and validation KL, and the
validation loss against the teacher's, drawn from its metrics.jsonl."""
from __future__ import annotations

from pathlib import Path

from ..output.metrics import read_metrics


def plot_stages(metrics_path, path, *, teacher_val_loss: float | None = None) -> Path:
    """Draw both stages' curves from the records of ``metrics_path`` into the PNG ``path`` (a dotted line at
    ``teacher_val_loss``, nats/token, where given); returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    align = [r for r in records if r.get("stage") == "align"]
    for key in sorted({k for r in align for k in r if k.startswith(("mse_layer", "val_mse_layer"))}):
        pts = [(r["step"], r[key]) for r in align if key in r]
        ax1.plot(*zip(*pts), "o-" if key.startswith("val") else "-", label=key, markersize=3, linewidth=1)
    ax1.set_yscale("log")
    ax1.set_title("stage 1: alignment MSE per layer")
    ax1.set_xlabel("step")
    distill = [r for r in records if r.get("stage") == "distill"]
    ax3 = ax2.twinx()  # the validation loss in nats per token, beside the teacher's, on its own scale
    for ax, key, style in ((ax2, "loss", "-"), (ax2, "val_kl", "o-"), (ax3, "val_loss", "s--")):
        pts = [(r["step"], r[key]) for r in distill if key in r and r[key] > 0]
        if pts:
            ax.plot(*zip(*pts), style, label=key, markersize=4, linewidth=1, color={"loss": "C0", "val_kl": "C1",
                                                                                     "val_loss": "C2"}[key])
    if teacher_val_loss is not None and any("val_loss" in r for r in distill):
        ax3.axhline(teacher_val_loss, linestyle=":", color="gray", label="teacher val_loss")
    ax2.set_yscale("log")
    ax2.set_ylabel("KL(teacher || student), nats/token")
    ax3.set_ylabel("validation loss, nats/token")
    ax2.set_title("stage 2: training loss and validation KL, validation loss")
    ax2.set_xlabel("step")
    if ax3.lines:
        ax3.legend(fontsize=7, loc="upper right")
    ax1.grid(True, alpha=0.3)
    ax2.grid(True, alpha=0.3)
    if ax1.lines:
        ax1.legend(fontsize=7)
    if ax2.lines:
        ax2.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return Path(path)
