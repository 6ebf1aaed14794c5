"""Synthetic capability tasks: seeded generators with labels at the positions each task defines, a small training
loop for them, and the ``hybrid-synthetic`` command line.

    from hybrid.train.tasks import make_task
    task = make_task("parity")                       # or "mod5", "mod5-brackets", "mqar"
    batch = task.train_batch(32, rng_of(0))          # batch.ids, batch.labels: (32, T); labels -100 elsewhere

Tasks: parity and modular arithmetic mod 5 (state tracking; Grazzi et al., arXiv 2411.12537), MQAR (associative
recall; Zoology, arXiv 2312.04927), passkey retrieval far beyond the training length (``passkey``: random filler;
``passkey-text``: natural-text filler, as in Samba). Each writes its token map to ``task.json`` in its run directory.
"""
from __future__ import annotations

from .base import IGNORE, Batch, Task, rng_of, scaled_accuracy
from .mqar import MQAR, ZOOLOGY_GRID
from .passkey.scoring import score_passkey, score_task_json
from .passkey.task import Passkey
from .state_tracking import TEST_LENGTHS, TRAIN_LENGTHS, ModularArithmetic, Parity, evaluate_expression

TASK_NAMES = ("parity", "mod5", "mod5-brackets", "mqar", "passkey", "passkey-text")


def make_task(name: str, **params) -> Task:
    """The task called ``name`` with its generator parameters (see each class)."""
    if name == "parity":
        return Parity(**params)
    if name == "mod5":
        return ModularArithmetic(brackets=False, **params)
    if name == "mod5-brackets":
        return ModularArithmetic(brackets=True, **params)
    if name == "mqar":
        return MQAR(**params)
    if name == "passkey":
        return Passkey(filler="random", **params)
    if name == "passkey-text":
        return Passkey(filler="text", **params)
    raise ValueError(f"task: expected one of {TASK_NAMES}, got {name!r}")


__all__ = [
    "IGNORE", "Batch", "Task", "MQAR", "Parity", "Passkey", "ModularArithmetic", "TASK_NAMES", "TEST_LENGTHS",
    "TRAIN_LENGTHS", "ZOOLOGY_GRID", "evaluate_expression", "make_task", "rng_of", "scaled_accuracy", "score_passkey",
    "score_task_json",
]
