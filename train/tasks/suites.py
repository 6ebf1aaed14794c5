"""The synthetic suites: which models, which tasks, which budgets, and the report.

Suites: ``state-tracking`` (parity, mod5, mod5-brackets), ``mqar`` (the Zoology grid at two widths), ``all`` (those
two), ``parity-recipe`` (the state-tracking recipe and its candidates, ``CANDIDATES``, on parity over five seeds);
``passkey`` and ``passkey-text`` have their own models, budgets and report (``tasks.passkey.suites``).
Every model runs every learning rate of the budget's grid and every seed; the report keeps, per task and model,
the learning rate with the best validation accuracy (past the training lengths first, ``selection``), as the papers
pick the best of a grid.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from hybrid.models import PRESETS

from ..suite import Budget, RunSpec, fmt_mean_std, markdown_table, mean_std, plot_lines, run_suite, write_report
from .passkey import suites as passkey_suite
from .selection import summarise
from .train import TaskRunConfig, train_task

# vo-rnn-data-selective, the recipe before the parity study and the base of its candidates: the data-dependent
# rotation, selective decay with the hard recurrence gate (a token can hold the state exactly: γ_t = 1, no write)
RECIPE = {"rnn_phase": "data", "rnn_selective": True, "rnn_selective_gate": "hardsigmoid"}


def _plus(entry: tuple, overrides: dict | None = None, options: dict | None = None) -> tuple[str, dict, dict]:
    """A model entry ``(preset, HybridConfig overrides[, TaskRunConfig options])`` with more of each."""
    preset, base, *base_options = entry
    return preset, {**base, **(overrides or {})}, {**(base_options[0] if base_options else {}), **(options or {})}


SELECTIVE = ("vo-rnn", RECIPE)
# straight-through rounding of the angles to multiples of 2π/n from the middle of training on, and at inference
ROUND_LATE = {n: _plus(SELECTIVE, {"recurrence.phase_round": n, "recurrence.phase_round_at_inference": True},
                       {"phase_round_from": 0.5}) for n in (2, 4)}
# the state-tracking recipe (vo-rnn-recipe, the parity study's "recipe+round4-late+hold-0.25", docs/research/synthetic-tasks.md
# "Parity, reliably"): the angles rounded to quarter turns late, so a learnt flip (π) or quarter turn (π/2) is
# exact at any length, and recurrence gates below a quarter shut exactly (straight-through), so a token that
# nearly holds the state holds it exactly
STATE_RECIPE = _plus(ROUND_LATE[4], {"recurrence.hold_below": 0.25})
# model name -> (preset, HybridConfig overrides[, TaskRunConfig options])
MODELS = {
    "transformer": ("transformer", {}),
    "retnet": ("retnet", {}),
    "vo-rnn": ("vo-rnn", {"rnn_phase": "static"}),
    "vo-rnn-data": ("vo-rnn", {"rnn_phase": "data"}),
    "vo-rnn-data-selective": SELECTIVE,
    "vo-rnn-recipe": STATE_RECIPE,
    "hybrid": ("hybrid", {}),
    "hybrid-data": ("hybrid", {"rnn_phase": "data"}),
}
# the parity study's candidates (suite "parity-recipe", docs/research/synthetic-tasks.md): the recipe with one change each
CANDIDATES = {
    # straight-through rounding of the angles to {0, π}: from the middle of training, or from the start; both
    # round at inference too (the model trained on rounded angles)
    "recipe+round-late": ROUND_LATE[2],
    "recipe+round": _plus(SELECTIVE, {"recurrence.phase_round": 2, "recurrence.phase_round_at_inference": True}),
    "recipe+grow-80": _plus(SELECTIVE, options={"grow_lengths_to": 80}),  # lengths 3–40 growing to 3–80
    "recipe+steepest-init": _plus(SELECTIVE, {"recurrence.phase_init": "steepest"}),  # θ = π/2 at init
    "recipe+readout-norm": _plus(SELECTIVE, {"recurrence.readout_norm": True}),
    "recipe+real-sign": _plus(SELECTIVE, {"rnn_phase_map": "real-sign"}),  # real transitions γ_t(1 − 2σ)
    # the second round: rounding to quarter turns keeps a mod-4 counter (π/2 per 1) exact as well, and rounding
    # with the length curriculum
    "recipe+round4-late": ROUND_LATE[4],
    "recipe+round-late+grow-80": _plus(ROUND_LATE[2], options={"grow_lengths_to": 80}),
    "recipe+round4-late+grow-80": _plus(ROUND_LATE[4], options={"grow_lengths_to": 80}),
    # the third round, on what the probe found the recipe still misses (holds that are not exact): recurrence
    # gates below a quarter shut, straight-through
    "recipe+round4-late+hold-0.25": STATE_RECIPE,  # kept as the recipe, vo-rnn-recipe
}
# the G mixer (issue 46; not in the suites' default models): the data-dependent phase; with the recipe's angles, rounded
# to quarter turns from the middle of training on (GLA's decay gate, which has no exact hold); and with the whole
# recipe, R's hard gate too, whose gates below a quarter shut (γ_t = 1, straight-through)
G_ROUNDED = {"gla.phase": "data", "gla.phase_round": 4, "gla.phase_round_at_inference": True}
G_HARD = {**G_ROUNDED, "gla.gate": "hardsigmoid", "gla.hold_below": 0.25}
G_MODELS = {
    "vo-gla-data": ("vo-gla", {"gla.phase": "data"}),
    "vo-gla-recipe": ("vo-gla", G_ROUNDED, {"phase_round_from": 0.5}),
    "vo-gla-recipe-hard": ("vo-gla", G_HARD, {"phase_round_from": 0.5}),
    # the same without the output norm, which divides a pair by its whole head (docs/research/gla.md, "parity")
    "vo-gla-recipe-hard-no-norm": ("vo-gla", {**G_HARD, "gla.output_norm": False}, {"phase_round_from": 0.5}),
}
KNOWN_MODELS = {**MODELS, **CANDIDATES, **G_MODELS}


def model_entry(model: str) -> tuple[str, dict, dict]:
    """(preset, HybridConfig overrides, TaskRunConfig options) of a suite model or candidate."""
    preset, overrides, *options = KNOWN_MODELS[model]
    return preset, overrides, (options[0] if options else {})
# task -> HybridConfig overrides for every model and budget. MQAR unties the output layer from the embedding:
# tied, a 2-layer transformer sits at accuracy 1/pairs for thousands of steps even at the easiest grid point,
# untied it recalls within a few hundred (docs/research/synthetic-tasks.md)
TASK_MODEL = {"mqar": {"tie_embeddings": False}}
SUITES = {"state-tracking": ("parity", "mod5", "mod5-brackets"), "mqar": ("mqar",)}
SUITES["all"] = SUITES["state-tracking"] + SUITES["mqar"]
SUITES["parity-recipe"] = ("parity",)  # not in "all": the recipe and its candidates over five seeds
RECIPE_STUDY = {"models": ("vo-rnn-data-selective", *CANDIDATES), "seeds": (0, 1, 2, 3, 4)}
SUITES.update(passkey_suite.SUITES)  # not in "all": its own models and budgets

# task -> [(model, test point, accuracy it should reach)]: the state-tracking claims the suite checks
TARGETS = {"parity": [("vo-rnn-data", "256", 0.99), ("vo-rnn-data-selective", "256", 0.99),
                      ("vo-rnn-recipe", "256", 0.99),
                      *[(name, "256", 0.99) for name in CANDIDATES]]}

ALL = tuple(MODELS)
# Depth: state tracking runs one layer (deeper stacks of the data-phase RNN fit lengths ≤ 40 with counting
# shortcuts that fail beyond; one layer must learn the flip, docs/research/synthetic-tasks.md), MQAR two (attention needs two
# layers to recall); a model whose pattern is longer (the hybrids' "RRA") gets one full pattern.
SMOKE_TASKS = {"state": {"train_lengths": [3, 10], "test_lengths": [10, 20]},
               "mqar": {"grid": [[16, 2], [32, 4]], "vocab_size": 32}}
# MQAR's "mqar_curriculum": the fraction of its steps drawn at the easiest grid point first (MQAR.curriculum_batch)
BUDGETS = {
    # seconds on a 2-core CPU, for the tests: every model, tiny everything
    "smoke": Budget(name="smoke", models=ALL, steps=3, seq_len=10, seeds=(0,), batch_size=4, d_model=16,
                    n_layers=1, n_heads=2, lrs=(3e-3,), eval_size=8,
                    extra={"task_params": SMOKE_TASKS, "mqar_widths": [16], "mqar_layers": 2,
                           "mqar_curriculum": 0.34}),
    # state tracking: one seed, a two-point learning-rate grid, 28 min. MQAR: the Zoology grid at a 64-token
    # vocabulary (512 tokens learn several times slower) with token-0 filler, the first quarter of the steps at
    # 64x4, the same two rates, 28 runs in under an hour (docs/research/synthetic-tasks.md)
    "cpu": Budget(name="cpu", models=ALL, steps=1000, seq_len=40, seeds=(0,), batch_size=64, d_model=64,
                  n_layers=1, n_heads=2, lrs=(1e-3, 3e-3), eval_size=256,
                  extra={"task_params": {"mqar": {"vocab_size": 64, "random_filler": False}}, "mqar_widths": [64, 128],
                         "mqar_steps": 500, "mqar_layers": 2, "mqar_curriculum": 0.25}),
    # about one GPU-hour: three seeds, a wider grid, Zoology's vocabulary
    "gpu": Budget(name="gpu", models=ALL, steps=4000, seq_len=40, seeds=(0, 1, 2), batch_size=128, d_model=128,
                  n_layers=1, n_heads=4, lrs=(3e-4, 1e-3, 3e-3), eval_size=1024,
                  extra={"task_params": {"mqar": {"vocab_size": 8192}}, "mqar_widths": [64, 128],
                         "mqar_steps": 8000, "mqar_layers": 2, "mqar_curriculum": 0.1}),
}


def budget_for(name: str, *, steps=None, seq_len=None, seeds=None, models=None, suite: str | None = None) -> Budget:
    """The named budget with the command line's overrides; ``steps`` sets every task's steps (MQAR's too).
    ``suite``: the suite or single task the budget is for (the passkey ones have their own table)."""
    if suite in passkey_suite.SUITES or suite in passkey_suite.TASKS:
        return passkey_suite.budget_for(name, steps=steps, seq_len=seq_len, seeds=seeds, models=models)
    if name not in BUDGETS:
        raise ValueError(f"budget: expected one of {list(BUDGETS)}, got {name!r}")
    budget = BUDGETS[name]
    if suite == "parity-recipe":  # its own models and five seeds, the rest as the budget says
        budget = dataclasses.replace(budget, **RECIPE_STUDY)
    known = KNOWN_MODELS if suite == "parity-recipe" else {**MODELS, **G_MODELS}  # the candidates: their suite only
    budget = budget.override(steps=steps, seq_len=seq_len, seeds=seeds, models=models, known_models=known)
    if steps is not None and "mqar_steps" in budget.extra:
        budget = dataclasses.replace(budget, extra={k: v for k, v in budget.extra.items() if k != "mqar_steps"})
    return budget


# (budget, task) -> {model: the learning rate its study picked by validation}: a single ``--task`` run of that
# exact model uses it by default (docs/research/synthetic-tasks.md, "Parity, reliably")
BEST_LRS = {("cpu", "parity"): {"vo-rnn-recipe": 3e-3, "vo-rnn-data-selective": 3e-3}}


def default_lr(budget: Budget, task: str, preset: str, overrides: dict, options: dict) -> tuple[float, str]:
    """(learning rate, why) for a single run: the measured best rate of the suite model whose configuration and
    run options this run has exactly, else the largest rate of the budget's grid."""
    known = BEST_LRS.get((budget.name, task), {})
    if known:
        from hybrid.models import HybridConfig

        from . import make_task

        vocab = make_task(task, **task_params(budget, task)).vocab_size

        def config(p, o):
            return HybridConfig.preset(p, "tiny", vocab_size=vocab, **o).to_dict()

        shape = model_shape(budget, task, preset)
        want = config(preset, {**shape, **overrides})
        for model, lr in known.items():
            p, o, opts = model_entry(model)
            if p == preset and opts == options and config(p, {**model_shape(budget, task, p), **o}) == want:
                return lr, f"{model}'s best rate on {task} at the {budget.name} budget, chosen by validation"
    return max(task_lrs(budget, task)), f"the largest of the {budget.name} budget's grid"


def _floor_text(majority: dict | None) -> str:
    """"; the most common answer alone scores 0.22–0.33 at the test points" (one value when they agree), or ""
    for records without ``majority_accuracy``."""
    if not majority:
        return ""
    low, high = (f"{f(majority.values()):.3g}" for f in (min, max))
    return f"; the most common answer alone scores {low if low == high else f'{low}–{high}'} at the test points"


def task_params(budget: Budget, task: str) -> dict:
    """The generator parameters a budget sets for ``task``; ``seq_len`` is the longest training length."""
    if task in passkey_suite.TASKS:
        return passkey_suite.task_params(budget, task)
    given = budget.extra.get("task_params", {})
    if task == "mqar":
        return dict(given.get("mqar", {}))
    params = dict(given.get("state", {}))
    lo, hi = params.get("train_lengths", [3, 40])
    if budget.seq_len != hi:  # --seq-len moves the longest training length
        params["train_lengths"] = [min(lo, budget.seq_len), budget.seq_len]
    return params


def model_shape(budget: Budget, task: str, preset: str, width: int | None = None) -> dict:
    """The HybridConfig overrides of ``preset`` on ``task``: d_model, n_layers and n_heads (the budget's depth for
    the task, but at least one full pattern of the preset: the hybrid's "RRA" needs three layers to hold its
    attention layer), plus the task's own (``TASK_MODEL``; passkey: ``passkey_suite.model_shape``)."""
    if task in passkey_suite.TASKS:
        return passkey_suite.model_shape(budget, preset)
    depth = budget.extra.get("mqar_layers", budget.n_layers) if task == "mqar" else budget.n_layers
    return {"d_model": width or budget.d_model, "n_layers": max(depth, len(PRESETS[preset]["pattern"])),
            "n_heads": budget.n_heads, **TASK_MODEL.get(task, {})}


def task_steps(budget: Budget, task: str) -> int:
    """Optimizer steps of a run on ``task`` (MQAR may have its own, ``mqar_steps``)."""
    return budget.extra.get("mqar_steps", budget.steps) if task == "mqar" else budget.steps


def task_lrs(budget: Budget, task: str) -> tuple[float, ...]:
    """The learning-rate grid of ``task`` (MQAR may have its own, ``mqar_lrs``)."""
    return tuple(budget.extra.get("mqar_lrs", budget.lrs)) if task == "mqar" else budget.lrs


def curriculum_steps(budget: Budget, task: str, steps: int) -> int:
    """How many of a run's ``steps`` train on the task's easiest setting first (MQAR: ``mqar_curriculum``;
    passkey: its budget's ``curriculum``)."""
    if task in passkey_suite.TASKS:
        return passkey_suite.curriculum_steps(budget, steps)
    fraction = budget.extra.get("mqar_curriculum", 0.0) if task == "mqar" else 0.0
    return int(round(fraction * steps))


def lr_name(lr: float) -> str:
    return f"lr{lr:g}"


def build_specs(suite: str, budget: Budget, *, device: str = "auto") -> list[RunSpec]:
    """Every run of ``suite`` under ``budget``: task × (width) × model × lr × seed."""
    if suite not in SUITES:
        raise ValueError(f"suite: expected one of {sorted(SUITES)}, got {suite!r}")
    if suite in passkey_suite.SUITES:
        return passkey_suite.build_specs(suite, budget, device=device)
    specs = []
    for task in SUITES[suite]:
        widths = budget.extra.get("mqar_widths", [budget.d_model]) if task == "mqar" else [budget.d_model]
        steps, lrs = task_steps(budget, task), task_lrs(budget, task)
        for width in widths:
            task_label = f"{task}-d{width}" if task == "mqar" else task
            for model in budget.models:
                preset, overrides, options = model_entry(model)
                shape = model_shape(budget, task, preset, width)
                for lr in lrs:
                    for seed in budget.seeds:
                        config = TaskRunConfig(
                            task=task, task_params=task_params(budget, task), preset=preset,
                            model={**shape, **overrides}, steps=steps, batch_size=budget.batch_size, lr=lr,
                            curriculum_steps=curriculum_steps(budget, task, steps), seed=seed,
                            eval_size=budget.eval_size, device=device, **options,
                        )
                        specs.append(RunSpec(run=f"{task_label}/{model}/{lr_name(lr)}/seed{seed}", model=model,
                                             seed=seed, steps=steps,
                                             config={"task_label": task_label, **config.to_dict()}))
    return specs


def execute(spec: RunSpec, run_dir: Path, advance) -> dict:
    config = TaskRunConfig(**{k: v for k, v in spec.config.items() if k != "task_label"})
    return train_task(config, run_dir, on_step=lambda step, loss: advance(1))


# ---------------------------------------------------------------------------------------------------- report


def write_suite_report(out, suite: str, budget: Budget, records: list[dict]) -> Path:
    out = Path(out)
    summary = summarise(records)
    sections = [
        f"Suite `{suite}`, budget `{budget.name}`: {len(records)} runs, "
        f"{len(budget.seeds)} seed(s), learning-rate grid "
        f"{', '.join(f'{v:g}' for v in sorted({r['config']['lr'] for r in records}))} "
        "(each row keeps the rate with the best validation accuracy, as the papers report the best of a small "
        "grid: for state tracking, first the accuracy on fresh sequences of twice the longest training length "
        "(`valid@2L`, past the training lengths and short of the tests), then on fresh sequences of the training "
        "distribution; rates that tie exactly on every term, accuracy and loss, are each shown and marked (tie)).",
        "```\n" + budget.describe() + "\n```",
    ]
    commits = sorted({r.get("commit", "unknown") for r in records})
    machines = sorted({str(r.get("machine", {}).get("gpu") or r.get("machine", {}).get("platform")) for r in records})
    sections.append(f"Commit(s): {', '.join(commits)}. Machine(s): {', '.join(machines)}.")
    for task_label, models in summary.items():
        any_metrics = next(iter(models.values()))[0]["records"][0]["metrics"]
        points = list(any_metrics["accuracy"])
        chance = any_metrics["chance"]
        where = "every query" if any_metrics["score"] == "all" else "the last labelled position"
        long = "valid_long_accuracy" in any_metrics
        headers = ["model", "lr", "valid acc"] + (["valid@2L acc"] if long else [])
        headers += [f"acc@{p}" for p in points] + [f"scaled@{points[-1]}"]
        xs = [int(p.split("x")[0]) for p in points]
        rows, series, targets = [], {}, []
        for model in [m for m in KNOWN_MODELS if m in models]:
            for choice in models[model]:
                recs = [r["metrics"] for r in choice["records"]]
                lr = f"{choice['lr']:g}" + (" (tie)" if choice["tied"] else "")
                row = [model, lr, fmt_mean_std([m["valid_accuracy"] for m in recs])]
                if long:
                    row.append(fmt_mean_std([m.get("valid_long_accuracy", float("nan")) for m in recs]))
                row += [fmt_mean_std([m["accuracy"][p] for m in recs]) for p in points]
                row.append(fmt_mean_std([m["scaled_accuracy"][points[-1]] for m in recs]))
                rows.append(row)
                stats = [mean_std(m["accuracy"][p] for m in recs) for p in points]
                label = f"{model} lr {choice['lr']:g}" if choice["tied"] else model
                series[label] = (xs, [s[0] for s in stats], [s[1] for s in stats])
                for point, goal in [(p, g) for m, p, g in TARGETS.get(task_label, []) if m == model and p in points]:
                    got, _ = mean_std(m["accuracy"][point] for m in recs)
                    verdict = "met" if got >= goal else f"missed by {goal - got:.3f}"
                    at = f" at lr {choice['lr']:g} (tied on validation with another rate)" if choice["tied"] else ""
                    targets.append(f"Target: {model} ≥ {goal:.2f} accuracy at length {point}{at}: {got:.3f}, {verdict}.")
        plot = f"{task_label}.png"
        plot_lines(out / plot, series, xlabel="test length", ylabel="accuracy", title=task_label, logx=True,
                   hline=chance)
        floor = _floor_text(any_metrics.get("majority_accuracy"))  # the same test sequences for every model
        sections += [
            f"## {task_label}",
            f"Accuracy at {where}; chance {chance:.3g}{floor}; scaled = (acc − chance) / (1 − chance) "
            "(Grazzi et al.: 1 perfect, 0 chance).",
            markdown_table(headers, rows),
            *(["\n".join(f"- {t}" for t in targets)] if targets else []),
            f"![{task_label}]({plot})",
            *_per_seed_section(task_label, records, models, points[-1]),
        ]
    all_rows = []
    for r in records:
        m = r["metrics"]
        last = list(m["accuracy"])[-1]
        long = f"{m['valid_long_accuracy']:.3f}" if "valid_long_accuracy" in m else "–"
        all_rows.append([r["config"]["task_label"], r["model"], f"{r['config']['lr']:g}", r["seed"], m["status"],
                         f"{m['final_loss']:.4f}", f"{m['valid_accuracy']:.3f}", long, f"{m['accuracy'][last]:.3f}",
                         f"{r['seconds']:.0f}"])
    sections += ["## Every run", markdown_table(
        ["task", "model", "lr", "seed", "status", "final loss", "valid acc", "valid@2L acc", "acc@last", "seconds"],
        all_rows)]
    return write_report(out / "report.md", f"# Synthetic capability suite: {suite}", sections)


def _per_seed_section(task_label: str, records: list[dict], kept: dict, point: str) -> list[str]:
    """With several seeds: every model and rate, accuracy at ``point`` per seed, and how many seeds reach the
    task's target there; the rate the report keeps is marked. Nothing with one seed."""
    runs = [r for r in records if r["config"]["task_label"] == task_label]
    seeds = sorted({r["seed"] for r in runs})
    if len(seeds) < 2:
        return []
    goals = {m: g for m, p, g in TARGETS.get(task_label, []) if p == point}
    rows = []
    for model in [m for m in KNOWN_MODELS if m in kept]:
        kept_lrs = {choice["lr"] for choice in kept[model]}
        for lr in sorted({r["config"]["lr"] for r in runs if r["model"] == model}):
            by_seed = {r["seed"]: r["metrics"] for r in runs if r["model"] == model and r["config"]["lr"] == lr}
            accs = [by_seed[s]["accuracy"][point] if s in by_seed else None for s in seeds]
            goal = goals.get(model)
            reached = (f"{sum(a is not None and a >= goal for a in accs)} / {len(seeds)}" if goal is not None else "")
            rows.append([model, f"{lr:g}" + (" (kept)" if lr in kept_lrs else ""),
                         *["–" if a is None else f"{a:.3f}" for a in accs], reached])
    headers = ["model", "lr"] + [f"seed {s}" for s in seeds] + ["seeds ≥ target"]
    return [f"### {task_label}: accuracy at {point} per seed", markdown_table(headers, rows)]


def run_synthetic_suite(suite: str, budget: Budget, out, *, device: str = "auto", verbose: bool = True) -> Path:
    """Run (or resume) the suite and write ``report.md``; returns its path."""
    if suite in passkey_suite.SUITES:
        return passkey_suite.run_passkey_suite(suite, budget, out, device=device, verbose=verbose)
    specs = build_specs(suite, budget, device=device)
    records = run_suite(out, specs, execute, suite=suite, verbose=verbose)
    return write_suite_report(out, suite, budget, records)
