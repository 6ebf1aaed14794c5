"""The budgets of ``hybrid-bench``: named sizes, steps, lengths and seeds (``hybrid.train.suite.Budget``).

| budget | for | reference model | training | seeds |
|---|---|---|---|---|
| ``smoke`` | the tests: all four suites in ≤ 5 minutes on 2 CPU cores | d 64, 3 layers, 2 heads | 12 steps of 4 × 32 | 1 |
| ``cpu`` | each suite ≤ 60 minutes on 2 CPU cores | d 128, 4 layers, 4 heads | 300 steps of 16 × 128 | 3 |
| ``long`` | past the window: L 1024, window 64, on 2 CPU cores (≈ 25 min per seed of the four long-context models) | d 128, 4 layers, 4 heads | 600 steps of 8 × 1024 | 2 |
| ``gpu`` | about one GPU-hour per suite (an estimate: not yet timed on a GPU) | d 384, 8 layers, 6 heads | 3000 steps of 32 × 512 | 3 |
| ``gpu-long`` | past the window on one H100 (issue 42): the four long-context models, one seed in ≤ 8 minutes of one command (an estimate, below) | d 512, 8 layers, 8 heads | 300 steps of 32 × 2048 | 2 |

``extra`` holds what only this harness needs: the attention ``window`` of the windowed models, ``warmup``
steps, ``long_seqs`` (validation sequences of 8 × the training length for the long-context figures),
``decode_contexts`` and ``decode_tokens`` (the decoding cost), and ``finetune_steps`` (the extension suite's
fine-tune at 2×), ``window_blocks`` (validation blocks inside one document for ``window_bpb``, default 32).
``eval_size`` is the number of validation batches behind ``val_bpb``. Every budget has at
least 3 layers, so that the RRA and MMA hybrids hold an attention layer. ``match: "mlp"`` sizes the models by
their SwiGLU width at the budget's d_model (``speed.match_mlp``), keeping head_dim 64, the size the GPU's
attention kernels take; without it a model that misses the reference by more than 5 % gets another d_model.

``gpu-long``: ``hybrid-bench --suite baselines --budget gpu-long --models
transformer,transformer-window,hybrid,hybrid-selective --compile --max-minutes 8`` (docs/gpu.md, "The
long-context budget"), bf16 autocast on CUDA. The models are the H100's measured ``small`` size (d_model 512,
8 layers, 25.3M non-embedding parameters; the hybrids at 25.2–25.3M through their MLP width), and a step is
the measured 65,536 tokens (32 × 2048). The sizing is an estimate from the H100 figures of 2026-11-27
(docs/research/gpu.md: eager bf16, one AdamW step, 65,536 tokens, T = 8K: hybrid 581k tokens/s, Transformer
480k, selective hybrid 469k; first steps up to 71.5 s), not a timing of this budget:

| one command, one seed | seconds |
|---|---:|
| start, imports, the carried corpus read and tokenised (48 MiB: 10 s on this 2-core machine) | 30 |
| the process's first step: compile and Triton tuning, at most the 70 s measured | 70 |
| each later model's compile (three more models) | 3 × 30 = 90 |
| training, each model 300 × 65,536 = 19.7M tokens at 450k tokens/s (slowest measured 469k; packing unmeasured) | 4 × 44 = 175 |
| measuring, each model (validation, 8 sequences of 8 × L, 128 document blocks, decoding at 4K and 16K): the Transformers 10, the hybrids 45 (new Triton tunings at the evaluation's lengths, in fp32) | 2 × 10 + 2 × 45 = 110 |
| in all | 475 (≤ 480) |

Measured on 2026-11-27 (commit cfd699a): the first model, the global Transformer, took 190 s against its 30 +
70 + 44 + 10 here (training at 887k tokens/s: 22 s), so the 8 minutes held one model. Its log showed Dynamo
recompiling the packed attention for every document count, until its limit; fixed since (one graph for every
count). Since 2026-11-28 ``--compile`` compiles each kind of block once (``CompiledBlocks``): every compiled model
had compiled twice (the rotary table), and the hybrids' R layers once more for every document count (their
conv), which would have sent both hybrids of this budget through Dynamo's recompile limit. On the CPU the first
step of the 8-layer models takes 0.57× (Transformer) and 0.76× (hybrid) of a whole-model compile's
(docs/training.md, "Compile"). Records carry ``phase_seconds``, to replace this estimate with a measurement.

``--max-minutes 8`` starts a run only while the time left holds the longest run so far (``suite.TimeLimit``),
so a command that is slower than this estimate stops between runs, inside the device's 10 minutes, with its
records written; the same command continues. Two seeds: ``--seeds 0``, then ``--seeds 0,1``. Each model sees
19.7M tokens, 4.0 × the ``long`` budget's 4.9M and 0.41 of the carried corpus's training split (48.3M tokens:
no token seen twice). lr 1e-3 as the ``gpu`` budget's; warmup a tenth of the steps.
"""
from __future__ import annotations

import dataclasses
import json

from ..suite import Budget
from .suites import SUITES

__all__ = ["BUDGETS", "bench_budget", "with_window", "check_window", "dry_run", "recorded_budgets"]

BUDGETS = {
    "smoke": Budget(name="smoke", models=("-",), steps=12, seq_len=32, seeds=(0,), batch_size=4, d_model=64,
                    n_layers=3, n_heads=2, lrs=(3e-3,), eval_size=2,
                    extra={"window": 8, "warmup": 2, "long_seqs": 2, "decode_contexts": [64, 128],
                           "decode_tokens": 2, "finetune_steps": 4}),
    "cpu": Budget(name="cpu", models=("-",), steps=300, seq_len=128, seeds=(0, 1, 2), batch_size=16, d_model=128,
                  n_layers=4, n_heads=4, lrs=(2e-3,), eval_size=20,
                  extra={"window": 32, "warmup": 30, "long_seqs": 8, "decode_contexts": [4096, 16384],
                         "decode_tokens": 16, "finetune_steps": 60}),
    "long": Budget(name="long", models=("-",), steps=600, seq_len=1024, seeds=(0, 1), batch_size=8, d_model=128,
                   n_layers=4, n_heads=4, lrs=(2e-3,), eval_size=16,
                   extra={"window": 64, "warmup": 60, "long_seqs": 4, "window_blocks": 128,
                          "decode_contexts": [4096, 16384], "decode_tokens": 16, "finetune_steps": 60}),
    "gpu": Budget(name="gpu", models=("-",), steps=3000, seq_len=512, seeds=(0, 1, 2), batch_size=32, d_model=384,
                  n_layers=8, n_heads=6, lrs=(1e-3,), eval_size=100,
                  extra={"window": 128, "warmup": 200, "long_seqs": 32, "decode_contexts": [4096, 16384],
                         "decode_tokens": 64, "finetune_steps": 400}),
    "gpu-long": Budget(name="gpu-long", models=("-",), steps=300, seq_len=2048, seeds=(0, 1), batch_size=32,
                       d_model=512, n_layers=8, n_heads=8, lrs=(1e-3,), eval_size=16,
                       extra={"window": 64, "warmup": 30, "long_seqs": 8, "window_blocks": 128, "match": "mlp",
                              "decode_contexts": [4096, 16384], "decode_tokens": 16, "finetune_steps": 60}),
}


def bench_budget(name: str, suite: str) -> Budget:
    """The budget ``name`` with the models of ``suite``."""
    if name not in BUDGETS:
        raise ValueError(f"budget: expected one of {list(BUDGETS)}, got {name!r}")
    if suite not in SUITES:
        raise ValueError(f"suite: expected one of {list(SUITES)}, got {suite!r}")
    return dataclasses.replace(BUDGETS[name], models=tuple(SUITES[suite].models))


def with_window(budget: Budget, window: int) -> Budget:
    """``budget`` with attention window ``window`` (``--window``): the windowed models' window and the edges of
    the past-the-window buckets; it must be shorter than the training length."""
    if not 0 < window < budget.seq_len:
        raise ValueError(f"--window: expected 1 … {budget.seq_len - 1} tokens (fewer than the training length "
                         f"{budget.seq_len}), got {window}")
    return dataclasses.replace(budget, extra={**budget.extra, "window": window})


def check_window(budget: Budget) -> Budget:
    """``budget``, once every override is in (``--steps``, ``--seq-len``, ``--window``), if its window is shorter
    than its training length. A ``--seq-len`` at or below the budget's window would make the "windowed" models
    global and leave the past-the-window buckets empty or out of order."""
    window, L = budget.extra["window"], budget.seq_len
    if not window < L:
        raise ValueError(f"--seq-len: expected more tokens than the attention window {window} (or a --window "
                         f"below {L}), got {L}")
    return budget


# the fields of a budget that say how big and how long, which ``dry_run`` takes from ``smoke``
SIZES = ("steps", "seq_len", "batch_size", "d_model", "n_layers", "n_heads", "eval_size")
EXTRA_SIZES = ("window", "warmup", "long_seqs", "window_blocks", "decode_contexts", "decode_tokens", "finetune_steps")


def dry_run(budget: Budget) -> Budget:
    """``budget`` at the ``smoke`` budget's sizes (``--dry-run``): the same models, seeds, learning rates and
    ways (``match``), so that a suite meant for a GPU is rehearsed on the CPU in seconds. A budget sized by the MLP
    width (``match: "mlp"``) keeps its own head size at the smoke budget's heads (``gpu-long``: d_model 2 × 64 =
    128): at the smoke width of 64 one step of the MLP width (32) is 11 % of a model, too coarse for ± 5 %
    (``retnet-hybrid`` and ``hybrid-gla`` fall between two widths, 5.1 % above and 5.4 % below); at 128, 6 %."""
    smoke = BUDGETS["smoke"]
    sizes = {k: getattr(smoke, k) for k in SIZES}
    if budget.extra.get("match") == "mlp":
        sizes["d_model"] = smoke.n_heads * (budget.d_model // budget.n_heads)
    extra = {k: v for k, v in budget.extra.items() if k not in EXTRA_SIZES}
    return dataclasses.replace(budget, name=f"{budget.name} (dry run)", **sizes,
                               extra={**extra, **{k: v for k, v in smoke.extra.items() if k in EXTRA_SIZES}})


def recorded_budgets(records: list[dict]) -> list[Budget]:
    """The budgets ``records`` were trained under (``config.budget`` of each), for ``--report-only``: one per
    distinct budget, each with the models and seeds of all the commands that share it (``--models`` and
    ``--seeds`` choose runs; continuing a suite with more of them keeps its budget)."""
    merged: dict[str, dict] = {}
    for record in records:
        d = (record.get("config") or {}).get("budget")
        if not d:
            continue
        key = json.dumps({k: v for k, v in d.items() if k not in ("models", "seeds")}, sort_keys=True)
        seen = merged.setdefault(key, {**d, "models": [], "seeds": []})
        seen["models"] += [m for m in d["models"] if m not in seen["models"]]
        seen["seeds"] = sorted({*seen["seeds"], *d["seeds"]})
    return [Budget(**d) for d in merged.values()]
