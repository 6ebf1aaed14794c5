"""The tables of issue 46's evidence (``python -m hybrid.train.bench.gla_study report --out runs/gla``).

Every finished run of ``gla_study.jobs`` is read back; each table gives the mean ± std over the seeds that finished
(their number beside it) and a last table lists every run, finished or not. MQAR runs are scored again, from their
checkpoints on the same test sequences as their results, by the distance from each query back to its value: inside
the hybrids' attention window (``< WINDOW`` tokens) and beyond it.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

from ..suite import fmt_mean_std, markdown_table

WINDOW = 64


def _results(job) -> dict | None:
    path = job.done
    if not path.exists():
        return None
    if path.name == "results.json":
        return json.loads(path.read_text())
    records = path.parent / "results.jsonl"  # hybrid-bench: one record per run
    lines = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    return lines[-1]["metrics"] if lines else None


@torch.no_grad()
def mqar_by_distance(run_dir: Path, window: int = WINDOW) -> dict[str, tuple[float, float, float]]:
    """{point: (accuracy inside the window, beyond it, share of queries beyond)} on the run's own test sequences."""
    from ..tasks.base import IGNORE, rng_of
    from ..tasks.train import TEST_SEED, load_task_run

    model, task = load_task_run(run_dir)
    eval_size = json.loads((run_dir / "checkpoint" / "extra.json").read_text())["task_run"]["eval_size"] \
        if (run_dir / "checkpoint" / "extra.json").exists() else 256
    out = {}
    for i, point in enumerate(task.test_points()):
        batch = task.test_batch(point, eval_size, rng_of(TEST_SEED + i))
        logits, _ = model(batch.ids)
        hit = logits.argmax(-1) == batch.labels  # (N, T)
        n, T = batch.ids.shape
        pairs = int(point.split("x")[1])
        values = batch.ids[:, 1:2 * pairs:2]  # (N, p): the value tokens, at 2i + 1
        inside, beyond = [], []
        for r, t in (batch.labels != IGNORE).nonzero().tolist():
            where = (values[r] == batch.labels[r, t]).nonzero()
            distance = t - (2 * int(where[0]) + 1)
            (inside if distance < window else beyond).append(bool(hit[r, t]))
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        out[point] = (mean(inside), mean(beyond), len(beyond) / max(1, len(inside) + len(beyond)))
    return out


def _by_model(jobs, study: str) -> dict[str, list[tuple[object, dict]]]:
    groups = defaultdict(list)
    for job in jobs:
        if job.meta.get("study") == study:
            groups[job.meta["model"]].append((job, _results(job)))
    return groups


def _cells(values: list[float]) -> str:
    return fmt_mean_std(values) if values else "–"


def _seeds(runs) -> str:
    done = [j.meta["seed"] for j, r in runs if r is not None]
    return ",".join(map(str, done)) or "none"


def mqar_section(jobs) -> list[str]:
    groups = _by_model(jobs, "mqar")
    points = ["64x4", "128x8", "256x16"]
    rows, split_rows = [], []
    for model, runs in groups.items():
        done = [(j, r) for j, r in runs if r is not None]
        rows.append([model, _seeds(runs), str(done[0][1]["parameters"]) if done else "–"]
                    + [_cells([r["accuracy"][p] for _, r in done]) for p in points])
        if model.startswith("hybrid") or model == "transformer":
            splits = [mqar_by_distance(j.done.parent) for j, _ in done]
            split_rows.append([model, _seeds(runs)] + [
                f"{_cells([s[p][0] for s in splits])} / {_cells([s[p][1] for s in splits])}" for p in points[1:]])
    return (["## MQAR", "", markdown_table(["model", "seeds", "non-emb. params", *points], rows), "",
             f"Inside / beyond the {WINDOW}-token window (distance from the query back to its value):", "",
             markdown_table(["model", "seeds", "128x8 inside / beyond", "256x16 inside / beyond"], split_rows), ""])


def parity_section(jobs) -> list[str]:
    groups = _by_model(jobs, "parity")
    lengths = ["40", "64", "128", "256"]
    rows = []
    for model, runs in groups.items():
        done = [r for _, r in runs if r is not None]
        per_seed = " / ".join(f"{r['accuracy']['256']:.3f}" for r in done) or "–"
        rows.append([model, _seeds(runs), str(done[0]["parameters"]) if done else "–"]
                    + [_cells([r["accuracy"][n] for r in done]) for n in lengths] + [per_seed])
    return ["## Parity", "", markdown_table(["model", "seeds", "non-emb. params", *(f"acc@{n}" for n in lengths),
                                             "acc@256 per seed"], rows), ""]


def lm_section(jobs) -> list[str]:
    """One table: val bpb and bpb by context inside documents, each model's finished seeds, mean ± std."""
    groups = _by_model(jobs, "lm")
    finished = {model: [r for _, r in runs if r is not None] for model, runs in groups.items()}
    edges = next((done[0]["window_edges"] for done in finished.values() if done), None)
    if edges is None:
        return ["## Language modelling at the `long` budget", "", "no finished run", ""]
    head = ["model", "seeds", "val bpb"] + [f"[{a}, {b})" for a, b in zip(edges[:-1], edges[1:])]
    rows = [[model, _seeds(groups[model]), _cells([r["val_bpb"] for r in done])]
            + [_cells([r["window_bpb"][i] for r in done]) for i in range(len(edges) - 1)]
            for model, done in finished.items()]
    return ["## Language modelling at the `long` budget", "", markdown_table(head, rows), ""]


def passkey_section(jobs) -> list[str]:
    groups = _by_model(jobs, "passkey")
    rows = []
    for model, runs in groups.items():
        for job, r in runs:
            if r is None:
                rows.append([model, str(job.meta["seed"]), "not finished"])
                continue
            acc = r.get("accuracy", {})
            rows.append([model, str(job.meta["seed"]), f"{r.get('valid_accuracy', float('nan')):.3f}",
                         " / ".join(f"{k}: {v:.2f}" for k, v in acc.items())])
    return ["## Passkey", "", markdown_table(["model", "seed", "valid digit acc", "exact match by length"], rows), ""]


def write_report(out: Path, jobs) -> str:
    lines = ["# Issue 46: the G mixer's evidence (runs/gla)", ""]
    lines += parity_section(jobs) + mqar_section(jobs) + lm_section(jobs) + passkey_section(jobs)
    lines += ["## Every run", "", markdown_table(["run", "status"],
                                                  [[j.name, "finished" if j.done.exists() else "not finished"]
                                                   for j in jobs]), ""]
    text = "\n".join(lines)
    (Path(out) / "report.md").write_text(text)
    return text
