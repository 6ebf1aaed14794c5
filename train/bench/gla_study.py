"""Issue 46's evidence for the G mixer: every training run behind docs/research/gla/report.md, one at a time.

    python -m hybrid.train.bench.gla_study plan   --out runs/gla     # the runs and their commands, done or not
    nohup nice python -m hybrid.train.bench.gla_study run --out runs/gla > runs/gla.log 2>&1 &    # resumable
    python -m hybrid.train.bench.gla_study report --out runs/gla     # the tables (mean ± std over seeds)

Each run is one ``hybrid-synthetic --task`` or ``hybrid-bench`` command in a subprocess (one torch thread), skipped
when its results exist, so ``run`` continues where an interrupted one stopped. Every model of a study has the
non-embedding size of the study's reference (``REFERENCE``), matched through the SwiGLU width (``mlp_hidden``) at the
budget's d_model, so that no model wins by width; ``hybrid-bench`` matches its suite by itself.

- MQAR: the ``cpu`` synthetic budget at d_model 64 with 1000 steps (a quarter at 64x4) at lr 1e-3, the Transformer's
  rate; G, R, RetNet, each alone (2 layers) and in a hybrid with a 64-token window attention layer (3 layers).
  ``report`` scores every run again by the distance from each query back to its value: inside and beyond the window.
- Parity: the state-tracking budget (1 layer, d_model 64, 1000 steps, lengths 3–40), lr 3e-3 (the recipe's): G with the
  data-dependent phase (``--model vo-gla-data``), the same with the recipe's quarter-turn rounding from the middle of
  training on (``--model vo-gla-recipe``), with R's hard decay gate as well (``--model vo-gla-recipe-hard``: the
  whole recipe), the last without the output norm (``--model vo-gla-recipe-hard-no-norm``), G with the static phase,
  and the R recipe.
- LM: ``hybrid-bench --suite baselines --budget long --models hybrid-gla`` (bpb by context inside documents).
- Passkey: the recipe of docs/research/passkey/why.md (one turning pair per head, R's hard gate, a fifth of the keys
  at the edges, 4800 steps, lr 3e-3) for the GGA hybrid, with and without the output norm.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SEEDS = (0, 1)
WINDOW = 64  # the tiny hybrid preset's attention window (MQAR)
MQAR_STEPS, MQAR_LR = 1000, 1e-3
MQAR_MODELS = {  # name -> (preset, overrides)
    "transformer": ("transformer", {}),
    "vo-gla": ("vo-gla", {}),
    "hybrid-gla": ("hybrid", {"pattern": "GGA"}),
    "hybrid": ("hybrid", {}),
    "retnet": ("retnet", {}),
    "hybrid-mma": ("hybrid", {"pattern": "MMA"}),
    "vo-rnn": ("vo-rnn", {"rnn_phase": "static"}),
}
PARITY_LR = 3e-3
PARITY_MODELS = {  # name -> (preset, overrides, the suite model it is (train/tasks/suite.py) or None)
    "vo-rnn-recipe": ("vo-rnn", {}, "vo-rnn-recipe"),
    "vo-gla-data": ("vo-gla", {}, "vo-gla-data"),
    "vo-gla-recipe": ("vo-gla", {}, "vo-gla-recipe"),  # + quarter-turn rounding from the middle of training on
    "vo-gla-recipe-hard": ("vo-gla", {}, "vo-gla-recipe-hard"),  # + R's hard gate, shut below a quarter
    "vo-gla-recipe-hard-no-norm": ("vo-gla", {}, "vo-gla-recipe-hard-no-norm"),  # + no output norm
    "vo-gla-static": ("vo-gla", {}, None),
}
# the G recipes decide one answer (does G keep R's state tracking?) and run in a minute or two: two more seeds each
RECIPE_SEEDS = {name: (0, 1, 2, 3) for name in ("vo-gla-recipe", "vo-gla-recipe-hard", "vo-gla-recipe-hard-no-norm")}
REFERENCE = {"mqar": "transformer", "parity": "vo-rnn-recipe"}
PASSKEY_R = {"rnn_selective": True, "rnn_selective_gate": "hardsigmoid", "recurrence.rotary_dim": 2}
LM_REFERENCES = ("hybrid-selective", "transformer-window")
PASSKEY_G = {
    "hybrid-gla-hard": {"pattern": "GGA", "gla.rotary_dim": 2, "gla.gate": "hardsigmoid"},
    "hybrid-gla-hard-no-norm": {"pattern": "GGA", "gla.rotary_dim": 2, "gla.gate": "hardsigmoid",
                                "gla.output_norm": False},
}


@dataclass
class Job:
    name: str
    argv: list[str]
    done: Path  # exists once the run has finished
    meta: dict = field(default_factory=dict)


def _python() -> list[str]:
    return [sys.executable, "-m"]


def matched_mlp_hidden(task: str, preset: str, overrides: dict, target: int, options: dict | None = None) -> int:
    """The SwiGLU width that brings a synthetic-task model (the budget's shape plus ``overrides``) closest to
    ``target`` non-embedding parameters."""
    config = task_config(task, preset, overrides, options)
    from .speed import non_embedding_parameters

    a, b = (non_embedding_parameters(config.replace(mlp_hidden=h)) for h in (64, 128))
    per_unit = (b - a) / 64
    return max(8, round(64 + (target - a) / per_unit))


def task_config(task: str, preset: str, overrides: dict, options: dict | None = None):
    """The HybridConfig a ``hybrid-synthetic --task`` run builds at the ``cpu`` budget."""
    from ..tasks import make_task
    from ..tasks.suites import budget_for, model_entry, model_shape, task_params
    from hybrid.models import HybridConfig

    budget = budget_for("cpu", suite=task)
    base = {}
    if options and options.get("model"):
        preset, base, _ = model_entry(options["model"])
    vocab = make_task(task, **task_params(budget, task)).vocab_size
    return HybridConfig.preset(preset, "tiny", vocab_size=vocab,
                               **{**model_shape(budget, task, preset), **base, **overrides})


def _sets(overrides: dict) -> list[str]:
    out = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={json.dumps(v)}"]
    return out


def jobs(out: Path) -> list[Job]:
    from .speed import non_embedding_parameters

    found = []
    # parity
    ref_preset, ref_over, ref_model = PARITY_MODELS[REFERENCE["parity"]]
    target = non_embedding_parameters(task_config("parity", ref_preset, ref_over, {"model": ref_model}))
    for seed in sorted({*SEEDS, *(s for seeds in RECIPE_SEEDS.values() for s in seeds)}):
        for name, (preset, overrides, model) in PARITY_MODELS.items():
            if seed not in RECIPE_SEEDS.get(name, SEEDS):
                continue
            run = out / "parity" / name / f"seed{seed}"
            which = ["--model", model] if model else ["--preset", preset]
            argv = [*_python(), "hybrid.train.cli.synthetic", "--task", "parity", "--budget", "cpu", *which]
            if name != REFERENCE["parity"]:  # the R recipe as the suite defines it is the reference size
                hidden = matched_mlp_hidden("parity", preset, overrides, target, {"model": model})
                argv += _sets({**overrides, "mlp_hidden": hidden})
            argv += ["--lr", str(PARITY_LR), "--seeds", str(seed), "--out", str(run), "--quiet"]
            found.append(Job(f"parity/{name}/seed{seed}", argv, run / "results.json",
                             {"study": "parity", "model": name, "seed": seed}))
    # MQAR, seed by seed so that a cut-short study has every model at seed 0
    ref = MQAR_MODELS[REFERENCE["mqar"]]
    target = non_embedding_parameters(task_config("mqar", *ref))
    for seed in SEEDS:
        for name, (preset, overrides) in MQAR_MODELS.items():
            hidden = matched_mlp_hidden("mqar", preset, overrides, target)
            model = {**overrides, "mlp_hidden": hidden}
            run = out / "mqar" / name / f"seed{seed}"
            argv = [*_python(), "hybrid.train.cli.synthetic", "--task", "mqar", "--budget", "cpu", "--preset", preset,
                    *_sets(model), "--steps", str(MQAR_STEPS), "--lr", str(MQAR_LR), "--seeds", str(seed),
                    "--out", str(run), "--quiet"]
            found.append(Job(f"mqar/{name}/seed{seed}", argv, run / "results.json",
                             {"study": "mqar", "model": name, "seed": seed}))
    # language modelling at the long budget: hybrid-bench keeps its own records and resumes
    lm = out / "lm"
    for seed in SEEDS:
        argv = [*_python(), "hybrid.train.cli.bench", "--suite", "baselines", "--budget", "long", "--models",
                "hybrid-gla", "--seeds", str(seed), "--out", str(lm / f"seed{seed}"), "--threads", "1", "--quiet"]
        found.append(Job(f"lm/hybrid-gla/seed{seed}", argv, lm / f"seed{seed}" / "baselines" / "report.md",
                         {"study": "lm", "model": "hybrid-gla", "seed": seed}))
    # R (the selective RRA hybrid) and the windowed Transformer again, seed 0, with this code: their two-seed tables
    # (docs/research/beyond-the-window.md) were trained before the one training loop and at two threads
    for model in LM_REFERENCES:
        run = lm / model / "seed0"
        argv = [*_python(), "hybrid.train.cli.bench", "--suite", "baselines", "--budget", "long", "--models", model,
                "--seeds", "0", "--out", str(run), "--threads", "1", "--quiet"]
        found.append(Job(f"lm/{model}/seed0", argv, run / "baselines" / "report.md",
                         {"study": "lm", "model": model, "seed": 0}))
    # passkey with the recipe's settings, the GGA hybrid beside the RRA one of docs/research/passkey/why.md: one
    # turning pair per head and R's hard gate (GLA's gate cannot hold a key over thousands of tokens), with and
    # without the output norm (which parity found shrinks an exactly held pair's share as the head's other pairs grow)
    target = non_embedding_parameters(task_config("passkey", "hybrid", PASSKEY_R))
    for name, g_over in PASSKEY_G.items():
        hidden = matched_mlp_hidden("passkey", "hybrid", g_over, target)
        for seed in SEEDS:
            run = out / "passkey" / name / f"seed{seed}"
            argv = [*_python(), "hybrid.train.cli.synthetic", "--task", "passkey", "--budget", "cpu", "--preset",
                    "hybrid", "--lr", "3e-3", "--seeds", str(seed), "--steps", "4800",
                    *_sets({**g_over, "mlp_hidden": hidden}), "--edge-share", "0.2", "--out", str(run), "--quiet"]
            found.append(Job(f"passkey/{name}/seed{seed}", argv, run / "results.json",
                             {"study": "passkey", "model": name, "seed": seed}))
    return sorted(found, key=_priority)


# the order runs start in, so that a study cut short has the most of the questions: every claim about G with
# two seeds first (its MQAR beside the Transformer that validates the budget, its parity), then the other models
FIRST = ["parity/vo-rnn-recipe/seed0", "parity/vo-gla-data/seed0", "parity/vo-gla-recipe/seed0",
         "mqar/transformer/seed0", "mqar/vo-gla/seed0", "mqar/hybrid-gla/seed0", "mqar/hybrid/seed0",
         "mqar/retnet/seed0", "parity/vo-gla-recipe/seed1", "parity/vo-gla-data/seed1", "mqar/transformer/seed1",
         "mqar/vo-gla/seed1", "mqar/hybrid-gla/seed1", "parity/vo-rnn-recipe/seed1", "mqar/hybrid/seed1",
         "mqar/hybrid-mma/seed0", "mqar/vo-rnn/seed0", "mqar/retnet/seed1", "mqar/hybrid-mma/seed1",
         "mqar/vo-rnn/seed1"]


def _priority(job: Job) -> tuple:
    """``FIRST`` in its order, then the static-phase control, the language model and the passkey (the longest)."""
    if job.name in FIRST:
        return (0, FIRST.index(job.name))
    return (1, ("parity", "mqar", "lm", "passkey").index(job.meta["study"]), job.meta["seed"])


def _run(job: Job, log_dir: Path) -> int:
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = log_dir / (job.name.replace("/", "_") + ".log")
    with open(log, "w") as f:
        f.write(" ".join(job.argv) + "\n")
        f.flush()
        return subprocess.call(job.argv, stdout=f, stderr=subprocess.STDOUT, env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.gla_study", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("plan", "run", "report"))
    p.add_argument("--out", default="runs/gla")
    p.add_argument("--only", default=None, help="run only the jobs whose name starts with this (e.g. mqar/)")
    args = p.parse_args(argv)
    out = Path(args.out)
    all_jobs = [j for j in jobs(out) if args.only is None or j.name.startswith(args.only)]
    if args.command == "plan":
        for j in all_jobs:
            print(("done  " if j.done.exists() else "todo  ") + j.name + "\n      " + " ".join(j.argv[1:]))
        return 0
    if args.command == "run":
        for j in all_jobs:
            if j.done.exists():
                continue
            print(f"start {j.name}", flush=True)
            rc = _run(j, out / "logs")
            print(f"end   {j.name}: exit {rc}", flush=True)
        return 0
    from .gla_report import write_report

    print(write_report(out, all_jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
