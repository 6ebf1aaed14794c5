"""The budgets of ``hybrid-bench``: named sizes, steps, lengths and seeds (``hybrid.train.suite.Budget``).

| budget | for | reference model | training | seeds |
|---|---|---|---|---|
| ``smoke`` | the tests: all four suites in ≤ 5 minutes on 2 CPU cores | d 64, 3 layers, 2 heads | 12 steps of 4 × 32 | 1 |
| ``cpu`` | each suite ≤ 60 minutes on 2 CPU cores | d 128, 4 layers, 4 heads | 300 steps of 16 × 128 | 3 |
| ``long`` | past the window: L 1024, window 64, on 2 CPU cores (≈ 25 min per seed of the four long-context models) | d 128, 4 layers, 4 heads | 600 steps of 8 × 1024 | 2 |
| ``gpu`` | about one GPU-hour per suite (an estimate: not yet timed on a GPU) | d 384, 8 layers, 6 heads | 3000 steps of 32 × 512 | 3 |

``extra`` holds what only this harness needs: the attention ``window`` of the windowed models, ``warmup``
steps, ``long_seqs`` (validation sequences of 8 × the training length for the long-context figures),
``decode_contexts`` and ``decode_tokens`` (the decoding cost), and ``finetune_steps`` (the extension suite's
fine-tune at 2×), ``window_blocks`` (validation blocks inside one document for ``window_bpb``, default 32).
``eval_size`` is the number of validation batches behind ``val_bpb``. Every budget has at
least 3 layers, so that the RRA and MMA hybrids hold an attention layer.
"""
from __future__ import annotations

import dataclasses

from ..suite import Budget
from .suites import SUITES

__all__ = ["BUDGETS", "bench_budget", "with_window"]

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
