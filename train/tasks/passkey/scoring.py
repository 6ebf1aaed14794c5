"""Scoring a model on passkey retrieval: every (length, depth) cell of a ``Passkey`` test set, read in chunked mode
(``chunk_size`` tokens at a time, each continuing the state, so memory stays bounded by the chunk and the model's
state whatever the length), logits kept only at the k answer positions; with YaRN at each test length if asked; a
``task.json`` generated elsewhere (``score_task_json``); the needle-in-a-haystack heatmap (``plot_heatmap``)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..base import scaled_accuracy

__all__ = ["CHUNK_SIZE", "MAX_TOKENS", "answer_logits", "yarn_scaling", "score_passkey", "score_task_json",
           "plot_heatmap"]

CHUNK_SIZE = 512  # tokens per chunked-mode call when scoring
MAX_TOKENS = 32_768  # tokens per scoring batch (sequences × length)


@torch.no_grad()
def answer_logits(model, ids: torch.Tensor, n_answer: int, chunk_size: int = CHUNK_SIZE) -> torch.Tensor:
    """Logits ``(B, n_answer, V)`` at the last ``n_answer`` positions of ``ids`` ``(B, T)``, computed in chunks of
    ``chunk_size`` tokens that each continue the model's state (``HybridLM``'s chunked mode); only the answer
    positions' logits are kept, so memory is one chunk plus the model's state."""
    T = ids.size(1)
    state, kept = None, []
    for start in range(0, T, chunk_size):
        logits, state = model(ids[:, start : start + chunk_size], mode="chunked", chunk_size=chunk_size, state=state)
        first = max(0, T - n_answer - start)
        if first < logits.size(1):
            kept.append(logits[:, first:])
    return torch.cat(kept, dim=1)


def yarn_scaling(length: int, train_length: int) -> dict | None:
    """YaRN's ``rope_scaling`` for reading sequences of ``length`` with a model trained at ``train_length``
    (factor length / train_length; None at or below the training length)."""
    if length <= train_length:
        return None
    return {"rope_type": "yarn", "factor": float(length) / train_length,
            "original_max_position_embeddings": train_length}


def _scaled_copy(model, scaling: dict | None):
    from hybrid.models import HybridLM

    if scaling == model.config.rotary.scaling:
        return model
    scaled = HybridLM(model.config.replace(rope_scaling=scaling)).to(next(model.parameters()).device)
    scaled.load_state_dict(model.state_dict())
    return scaled.eval()


@torch.no_grad()
def score_passkey(model, task, device="cpu", *, test_set: dict | None = None, rope_scaling: str | None = None,
                  chunk_size: int = CHUNK_SIZE, max_tokens: int = MAX_TOKENS) -> dict:
    """Exact match and per-digit accuracy of ``model`` in every (length, depth) cell of ``task``'s test set (a
    ``Passkey``).

    ``rope_scaling="yarn"`` reads each length L above the training length with YaRN at factor L / train_length
    (a copy of the model with that ``rope_scaling``; the weights are the same). Returns ``accuracy`` (exact match
    per length, the mean over depths), ``digit_accuracy``, ``scaled_accuracy``, ``test_loss`` (per length) and
    ``passkey``: ``{"lengths", "depths", "exact", "digit", "loss"}`` with ``[length][depth]`` grids.
    """
    if rope_scaling not in (None, "yarn"):
        raise ValueError(f"rope_scaling: expected None or 'yarn', got {rope_scaling!r}")
    device = torch.device(device)
    test_set = task.test_set() if test_set is None else test_set
    was_training = model.training
    model.eval()
    k, S, D = task.k, task.samples, len(task.depths)
    grids = {"exact": [], "digit": [], "loss": []}
    out = {"accuracy": {}, "digit_accuracy": {}, "scaled_accuracy": {}, "test_loss": {}}
    for length in task.test_lengths:
        scaling = yarn_scaling(length, task.train_length) if rope_scaling == "yarn" else model.config.rotary.scaling
        scorer = _scaled_copy(model, scaling)
        batch = task.cell_batch(test_set, length)
        per_batch = max(1, max_tokens // length)
        exact, digit, loss = [], [], []
        for start in range(0, batch.ids.size(0), per_batch):
            ids = batch.ids[start : start + per_batch].to(device)
            want = batch.labels[start : start + per_batch, -k:].to(device)  # (n, k)
            logits = answer_logits(scorer, ids, k, chunk_size).float()  # (n, k, V)
            hit = logits.argmax(-1) == want
            exact.append(hit.all(-1).float().cpu())
            digit.append(hit.float().mean(-1).cpu())
            loss.append(F.cross_entropy(logits.transpose(1, 2), want, reduction="none").mean(-1).cpu())
        cells = [torch.cat(v).view(D, S).mean(1).tolist() for v in (exact, digit, loss)]  # rows are depth-major
        for name, cell in zip(("exact", "digit", "loss"), cells):
            grids[name].append(cell)
        point = str(length)
        out["accuracy"][point] = float(np.mean(cells[0]))
        out["digit_accuracy"][point] = float(np.mean(cells[1]))
        out["scaled_accuracy"][point] = scaled_accuracy(out["accuracy"][point], task.chance)
        out["test_loss"][point] = float(np.mean(cells[2]))
    model.train(was_training)
    out["passkey"] = {"lengths": list(task.test_lengths), "depths": list(task.depths), "samples": S,
                      "chunk_size": chunk_size, "rope_scaling": rope_scaling, **grids}
    return out


def score_task_json(model, spec, device="cpu", **kwargs) -> dict:
    """Score ``model`` on the test set of a passkey ``task.json`` (a path or its loaded dict), as generated
    elsewhere: the task is rebuilt from its parameters and the sequences from the stored haystacks or the seed
    (checked against the stored SHA-256). ``kwargs`` go to ``score_passkey``."""
    from .. import make_task

    if not isinstance(spec, dict):
        spec = json.loads(Path(spec).read_text())
    if spec.get("task") not in ("passkey", "passkey-text"):
        raise ValueError(f"task.json: expected a passkey task, got {spec.get('task')!r}")
    task = make_task(spec["task"], **spec["params"])
    if task.vocab_size > model.config.vocab_size:
        raise ValueError(f"model: expected a vocabulary of at least {task.vocab_size} (task.json), got "
                         f"{model.config.vocab_size}")
    return score_passkey(model, task, device, test_set=task.test_set_from_json(spec), **kwargs)


# ---------------------------------------------------------------------------------------------------- figure


def plot_heatmap(path, lengths, depths, values, *, title: str | None = None) -> Path:
    """The needle-in-a-haystack heatmap: ``values[length][depth]`` in [0, 1] (exact match), depth down, length
    across, each cell annotated. Returns the path (PNG, written atomically)."""
    from ...suite import report  # chooses the Agg backend

    plt = report.plt
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = np.asarray(values, dtype=np.float64).T  # (depths, lengths)
    width, height = max(3.6, 1.6 + 0.6 * len(lengths)), max(2.2, 1.0 + 0.25 * len(depths))
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    fig.subplots_adjust(left=0.9 / width, right=1 - 0.9 / width, bottom=0.55 / height, top=1 - 0.35 / height)
    try:
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths], fontsize=7)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("key depth")
        for (i, j), v in np.ndenumerate(grid):
            if math.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
        fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
        if title:
            ax.set_title(title, fontsize=8)
        report.save_figure(fig, path)
    finally:
        plt.close(fig)
    return path
