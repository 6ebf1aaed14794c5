"""The passkey suite (``hybrid-synthetic --suite passkey``): which models, which budgets, and the report.

Every model trains on passkey sequences of ``seq_len`` tokens (the key beyond the attention window in most of
them) and is tested at up to 32× that length, at every depth, in chunked mode. Every model runs every learning
rate of the budget's grid and every seed; the report keeps, per model, the rate with the best validation
accuracy (per-digit accuracy on fresh training-length sequences, as the other synthetic suites) and shows the
spread over seeds. The global transformer is also read with YaRN at each test length (the same checkpoint, its
``rope_scaling`` set to YaRN at factor length / seq_len): the report's ``transformer + YaRN`` row.

``passkey-text`` (natural-text filler) has the same models and budgets; the ``cpu`` budget is planned for
``passkey`` (random filler). The ``gpu`` budget is the LM passkey test of a pretrained ``gpu-long`` model
(``--task passkey-text --init-from RUN``, as Samba's §3.4; docs/gpu.md, "The LM passkey test").
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from hybrid.models import PRESETS

from ...parallel.device import resolve_device
from ...suite import Budget, RunSpec, fmt_mean_std, markdown_table, mean_std, run_suite, write_report
from .scoring import plot_heatmap, score_passkey
from ..selection import summarise
from ..train import RESULTS_FILE, TaskRunConfig, load_task_run, task_autocast, train_task

SUITES = {"passkey": ("passkey",), "passkey-text": ("passkey-text",)}
TASKS = ("passkey", "passkey-text")
# model name -> (preset, HybridConfig overrides). Every attention window is the budget's ``window`` (the hybrid
# preset's attention is windowed; "window": True asks for one on the transformer).
MODELS = {
    "transformer-window": ("transformer", {"window": True}),
    "transformer": ("transformer", {}),  # global attention; also scored with YaRN at test time
    "hybrid": ("hybrid", {}),  # RRA, static decay
    "hybrid-selective": ("hybrid", {"rnn_selective": True}),  # RG-LRU's σ recurrence gate
    "hybrid-selective-hard": ("hybrid", {"rnn_selective": True, "rnn_selective_gate": "hardsigmoid"}),
    "vo-rnn-selective": ("vo-rnn", {"rnn_selective": True, "rnn_selective_gate": "hardsigmoid"}),
    "retnet": ("retnet", {}),
    "hybrid-mma": ("hybrid", {"pattern": "MMA"}),  # two retention layers per windowed attention layer
}
YARN_MODELS = ("transformer",)
YARN_LABEL = " + YaRN"
# the output layer is untied from the embedding, as for MQAR (recall learns far faster untied)
TASK_MODEL = {"tie_embeddings": False}
ALL = tuple(MODELS)

SMOKE_TASK = {"test_lengths": [32, 64], "depths": 3, "samples": 2, "filler_vocab": 16}
# "curriculum": the fraction of a run's steps drawn at the task's curriculum_length (a quarter of seq_len) first
BUDGETS = {
    # seconds on a 2-core CPU, for the tests: every model, tiny everything
    "smoke": Budget(name="smoke", models=ALL, steps=3, seq_len=32, seeds=(0,), batch_size=4, d_model=16,
                    n_layers=3, n_heads=2, lrs=(3e-3,), eval_size=8,
                    extra={"window": 8, "curriculum": 0.34, "task_params": SMOKE_TASK}),
    # 8 models × 2 rates × 2 seeds = 32 runs, planned at about 41 min on the idle 2-core VM (60 min budget): 300
    # steps of 32 sequences at 64 tokens, then 300 at 256, with a 32-token window (the key beyond it in 89 % of
    # the 256-token sequences), tested at 256 … 8192 (32×), 11 depths, 4 sequences per cell. Sizing: a global
    # transformer at lr 3e-3 reached per-digit accuracy 0.21 after 250 steps at 256 tokens, 0.78 after 300 at 64
    # and 200 at 256 (single-thread probes, 2026-11-25)
    "cpu": Budget(name="cpu", models=ALL, steps=600, seq_len=256, seeds=(0, 1), batch_size=32, d_model=64,
                  n_layers=3, n_heads=2, lrs=(1e-3, 3e-3), eval_size=128,
                  extra={"window": 32, "curriculum": 0.5,
                         "task_params": {"test_lengths": [256, 512, 1024, 2048, 4096, 8192], "depths": 11,
                                         "samples": 4}}),
    # The LM passkey test as Samba runs it (arXiv 2406.07522 §3.4: 500 steps at 4K, retrieval to 256K), for
    # ``--task passkey-text --init-from`` a ``gpu-long`` model (issue 42; docs/gpu.md): 500 steps of 8 sequences at
    # that budget's L = 2048 (8.2M tokens, 0.42 of its pre-training's 19.7M), lr 1e-3 (its pre-training peak, and
    # the CPU protocol's: docs/research/distillation.md), tested at 2048 … 131,072 tokens (64 × L), 11 depths, 4
    # sequences a cell. Width, depth and heads are gpu-long's, for a fresh model; 500 steps are sized for a
    # pretrained one (a fresh model at the ``cpu`` budget needs thousands: docs/research/beyond-the-window.md).
    "gpu": Budget(name="gpu", models=ALL, steps=500, seq_len=2048, seeds=(0,), batch_size=8, d_model=512,
                  n_layers=8, n_heads=8, lrs=(1e-3,), eval_size=32,
                  extra={"window": 64, "curriculum": 0.0,
                         "task_params": {"test_lengths": [2048 << k for k in range(7)], "depths": 11,
                                         "samples": 4}}),
}


def budget_for(name: str, *, steps=None, seq_len=None, seeds=None, models=None) -> Budget:
    """The named passkey budget with the command line's overrides (``seq_len`` is the training length)."""
    if name not in BUDGETS:
        raise ValueError(f"budget: expected one of {list(BUDGETS)} for the passkey tasks, got {name!r}")
    return BUDGETS[name].override(steps=steps, seq_len=seq_len, seeds=seeds, models=models, known_models=MODELS)


RANDOM_FILLER_ONLY = ("filler_vocab",)  # parameters of the random filler that passkey-text's corpus filler refuses


def task_params(budget: Budget, task: str = "passkey") -> dict:
    """The generator parameters of ``task`` (passkey or passkey-text) under ``budget``: its ``task_params`` with
    ``train_length = seq_len``; passkey-text drops the random filler's own (``filler_vocab``)."""
    params = {**budget.extra.get("task_params", {}), "train_length": budget.seq_len}
    if task == "passkey-text":
        params = {k: v for k, v in params.items() if k not in RANDOM_FILLER_ONLY}
    return params


def curriculum_steps(budget: Budget, steps: int) -> int:
    """How many of a run's ``steps`` draw the short curriculum sequences first (``extra["curriculum"]``)."""
    return int(round(budget.extra.get("curriculum", 0.0) * steps))


def model_shape(budget: Budget, preset: str, overrides: dict | None = None) -> dict:
    """HybridConfig overrides of ``preset``: the budget's width, depth (at least one full pattern) and heads, the
    untied output layer, and the budget's window wherever attention is windowed."""
    overrides = dict(overrides or {})
    pattern = overrides.get("pattern", PRESETS[preset]["pattern"])
    shape = {"d_model": budget.d_model, "n_layers": max(budget.n_layers, len(pattern)), "n_heads": budget.n_heads,
             **TASK_MODEL}
    if overrides.pop("window", None) or PRESETS[preset].get("window") is not None:
        shape["window"] = budget.extra["window"]
    return {**shape, **overrides}


def lr_name(lr: float) -> str:
    return f"lr{lr:g}"


def build_specs(suite: str, budget: Budget, *, device: str = "auto") -> list[RunSpec]:
    """Every run of ``suite`` under ``budget``: model × lr × seed."""
    if suite not in SUITES:
        raise ValueError(f"suite: expected one of {sorted(SUITES)}, got {suite!r}")
    specs = []
    for task in SUITES[suite]:
        for model in budget.models:
            preset, overrides = MODELS[model]
            for lr in budget.lrs:
                for seed in budget.seeds:
                    config = TaskRunConfig(task=task, task_params=task_params(budget, task), preset=preset,
                                           model=model_shape(budget, preset, overrides), steps=budget.steps,
                                           curriculum_steps=curriculum_steps(budget, budget.steps),
                                           batch_size=budget.batch_size, lr=lr, seed=seed,
                                           eval_size=budget.eval_size, device=device)
                    specs.append(RunSpec(run=f"{task}/{model}/{lr_name(lr)}/seed{seed}", model=model, seed=seed,
                                         steps=budget.steps,
                                         config={"task_label": task, "yarn": model in YARN_MODELS,
                                                 **config.to_dict()}))
    return specs


def execute(spec: RunSpec, run_dir: Path, advance) -> dict:
    config = TaskRunConfig(**{k: v for k, v in spec.config.items() if k not in ("task_label", "yarn")})
    results = train_task(config, run_dir, on_step=lambda step, loss: advance(1))
    if spec.config.get("yarn"):  # the same checkpoint, read with YaRN at each test length
        device = resolve_device(config.device)
        model, task = load_task_run(run_dir, device)
        with task_autocast(device, model.config.dtype)():  # the precision of the run's own scoring
            results["yarn"] = score_passkey(model, task, device, rope_scaling="yarn")
        (Path(run_dir) / RESULTS_FILE).write_text(json.dumps(results, indent=1))
        grid = results["yarn"]["passkey"]
        plot_heatmap(Path(run_dir) / "passkey-yarn.png", grid["lengths"], grid["depths"], grid["exact"],
                     title=f"{task.name}: exact match, YaRN")
    return results


# ---------------------------------------------------------------------------------------------------- report


def _rows(summary: dict) -> list[tuple[str, dict, list[dict]]]:
    """(row label, lr choice, metrics per seed) in report order; the YaRN rows read the transformer's records."""
    rows = []
    for model in [m for m in MODELS if m in summary]:
        for choice in summary[model]:
            label = model + (f" (lr {choice['lr']:g}, tie)" if choice["tied"] else "")
            metrics = [r["metrics"] for r in choice["records"]]
            rows.append((label, choice, metrics))
            if model in YARN_MODELS and all("yarn" in m for m in metrics):
                rows.append((model + YARN_LABEL + label[len(model):], choice, [m["yarn"] for m in metrics]))
    return rows


def _machine(record: dict) -> str:
    m = record.get("machine", {})
    return str(m.get("gpu") or m.get("platform"))


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", label).strip("-")


def write_passkey_report(out, suite: str, budget: Budget, records: list[dict]) -> Path:
    """``report.md`` (exact match by length per model, mean ± std over seeds; per-digit accuracy; heatmaps),
    ``report.json`` (the same numbers and every cell) and one heatmap PNG per model (mean over seeds)."""
    from .. import make_task

    out = Path(out)
    by_task = summarise(records)
    sections = [
        f"Suite `{suite}`, budget `{budget.name}`: {len(records)} runs, {len(budget.seeds)} seed(s), learning-rate "
        f"grid {', '.join(f'{v:g}' for v in sorted({r['config']['lr'] for r in records}))} (each row keeps the "
        "rate with the best validation accuracy: per-digit accuracy on fresh sequences of the training length; "
        "rates that tie exactly are each shown and marked tie). Cells are mean ± std over seeds.",
        "```\n" + budget.describe() + "\n```",
        f"Commit(s): {', '.join(sorted({r.get('commit', 'unknown') for r in records}))}. Machine(s): "
        f"{', '.join(sorted({_machine(r) for r in records}))}.",
    ]
    report = {"suite": suite, "budget": budget.to_dict(), "tasks": {}}
    for task_label, summary in by_task.items():
        first = next(iter(summary.values()))[0]["records"][0]
        grid0 = first["metrics"]["passkey"]
        lengths, depths = grid0["lengths"], grid0["depths"]
        params = first["config"]["task_params"]
        window = budget.extra.get("window")
        headers = ["model", "params", "lr", "valid digit acc"] + [f"exact@{n}" for n in lengths]
        exact_rows, digit_rows, figures, entries = [], [], [], {}
        for label, choice, metrics in _rows(summary):
            records_ = choice["records"]
            n_params = records_[0]["metrics"]["parameters"]
            valid = [r["metrics"]["valid_accuracy"] for r in records_]
            exact = {str(n): [m["accuracy"][str(n)] for m in metrics] for n in lengths}
            digit = {str(n): [m["digit_accuracy"][str(n)] for m in metrics] for n in lengths}
            lr = f"{choice['lr']:g}"
            exact_rows.append([label, f"{n_params:,}", lr, fmt_mean_std(valid)]
                              + [fmt_mean_std(exact[str(n)]) for n in lengths])
            digit_rows.append([label, lr] + [fmt_mean_std(digit[str(n)]) for n in lengths])
            cells = [[mean_std(m["passkey"]["exact"][i][j] for m in metrics)[0] for j in range(len(depths))]
                     for i in range(len(lengths))]
            png = f"{task_label}-{_slug(label)}.png"
            plot_heatmap(out / png, lengths, depths, cells,
                         title=f"{label}: exact match, mean of {len(metrics)} seed(s)")
            figures.append(f"![{label}]({png})")
            entries[label] = {
                "lr": choice["lr"], "tied": choice["tied"], "parameters": n_params,
                "seeds": [r["seed"] for r in records_], "valid_accuracy": valid,
                "exact": {n: {"mean": mean_std(v)[0], "std": mean_std(v)[1], "seeds": v} for n, v in exact.items()},
                "digit": {n: {"mean": mean_std(v)[0], "std": mean_std(v)[1], "seeds": v} for n, v in digit.items()},
                "cells_exact_mean": cells, "heatmap": png,
            }
        task = make_task(task_label, **params)
        cur = first["config"].get("curriculum_steps", 0)
        where = (f"Trained at length {task.train_length}"
                 + (f" (its first {cur} steps at {', then '.join(map(str, task.curriculum_lengths))})" if cur else "")
                 + (f" with an attention window of {window} tokens (the key beyond it in "
                    f"{task.beyond_window_share(window):.0%} of the training-length sequences)" if window else "")
                 + f"; tested at {len(depths)} depths × {task.samples} sequences per length, in "
                   f"chunked mode. Exact match: all {task.k} digits right (chance "
                   f"{first['metrics']['chance']:.0e}); averaged over depths. Parameters: non-embedding (the "
                   "untied output layer included).")
        sections += [f"## {task_label}", where, markdown_table(headers, exact_rows),
                     "Per-digit accuracy (chance 0.1):",
                     markdown_table(["model", "lr"] + [f"digit@{n}" for n in lengths], digit_rows),
                     "\n".join(figures)]
        report["tasks"][task_label] = {"lengths": lengths, "depths": depths, "task_params": params, "models": entries}
    all_rows = []
    for r in records:
        m = r["metrics"]
        all_rows.append([r["run"], m["status"], f"{m['final_loss']:.4f}", f"{m['valid_accuracy']:.3f}",
                         f"{m['accuracy'][str(m['passkey']['lengths'][-1])]:.3f}", f"{r['seconds']:.0f}"])
    report["runs"] = [{"run": r["run"], "model": r["model"], "seed": r["seed"], "lr": r["config"]["lr"],
                       "seconds": r["seconds"], "metrics": r["metrics"]} for r in records]
    sections += ["## Every run", markdown_table(["run", "status", "final loss", "valid digit acc", "exact@longest",
                                                 "seconds"], all_rows)]
    tmp = out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, out / "report.json")
    return write_report(out / "report.md", f"# Passkey retrieval suite: {suite}", sections)


def run_passkey_suite(suite: str, budget: Budget, out, *, device: str = "auto", verbose: bool = True) -> Path:
    """Run (or resume) the suite and write ``report.md`` and ``report.json``; returns the report's path."""
    specs = build_specs(suite, budget, device=device)
    records = run_suite(out, specs, execute, suite=suite, verbose=verbose)
    return write_passkey_report(out, suite, budget, records)
