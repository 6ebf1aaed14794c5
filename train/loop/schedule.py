"""Learning rate: linear warmup, then cosine decay to `min_lr`, then constant `min_lr`.

Steps count from 0 (the first optimizer step uses `lr_at(0)`)::

    step < warmup            lr · (step + 1) / warmup
    warmup ≤ step ≤ total    min_lr + (lr − min_lr) · ½ (1 + cos(π · (step − warmup) / (total − warmup)))
    step > total             min_lr

A run that names no warmup gets `default_warmup(total) = min(100, total // 10)`.

`warmup_cosine(optimizer, ...)` is a `WarmupCosineLR`: a `LambdaLR` whose multiplier is a `WarmupCosine` object;
`LambdaLR` saves such an object's attributes in its `state_dict()`, so a resumed run gets back the schedule it
was started with, and its position (`last_epoch`). `set_total` changes the total (and the warmup and peak lr)
mid-run. Call `scheduler.step()` after each `optimizer.step()`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["lr_at", "default_warmup", "WarmupCosine", "WarmupCosineLR", "warmup_cosine"]


def _check(warmup: int, total: int) -> None:
    if warmup < 0 or total < 1 or warmup > total:
        raise ValueError(f"schedule: expected 0 <= warmup <= total and total >= 1, got warmup={warmup}, total={total}")


def default_warmup(total: int) -> int:
    """The warmup of a run that names none: a tenth of the steps, at most 100."""
    return min(100, total // 10)


def lr_at(step: int, *, lr: float, warmup: int, total: int, min_lr: float | None = None) -> float:
    """The learning rate of optimizer step `step` (0-based); `min_lr` defaults to `0.1 · lr`."""
    _check(warmup, total)
    min_lr = 0.1 * lr if min_lr is None else min_lr
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class WarmupCosine:
    """`LambdaLR` multiplier: `lr_at(step, lr=1, ...)` with `min_lr = min_lr_ratio`."""

    warmup: int
    total: int
    min_lr_ratio: float = 0.1

    def __post_init__(self):
        _check(self.warmup, self.total)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio: expected a number in [0, 1], got {self.min_lr_ratio}")

    def __call__(self, step: int) -> float:
        return lr_at(step, lr=1.0, warmup=self.warmup, total=self.total, min_lr=self.min_lr_ratio)


class WarmupCosineLR(torch.optim.lr_scheduler.LambdaLR):
    """`LambdaLR` over one `WarmupCosine` shared by every param group. Its `state_dict()` is `LambdaLR`'s, so
    schedules saved as a plain `LambdaLR` load into it."""

    @property
    def schedule(self) -> WarmupCosine:
        return self.lr_lambdas[0]

    def set_total(self, total: int, *, warmup: int | None = None, lr: float | None = None) -> None:
        """Stretch (or shrink) the cosine to end at step `total`; `warmup` and the peak `lr` (every group's
        base lr) change with it when given. The lr of the step about to run follows at once; the steps
        taken so far keep theirs."""
        warmup = self.schedule.warmup if warmup is None else warmup
        _check(warmup, total)
        self.schedule.warmup, self.schedule.total = warmup, total
        if lr is not None:
            self.base_lrs = [lr for _ in self.optimizer.param_groups]
            for group in self.optimizer.param_groups:
                group["initial_lr"] = lr
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * self.schedule(self.last_epoch)


def warmup_cosine(optimizer: torch.optim.Optimizer, *, warmup: int, total: int,
                  min_lr_ratio: float = 0.1) -> WarmupCosineLR:
    """A `WarmupCosineLR` over every param group (each scaled from its own initial lr)."""
    return WarmupCosineLR(optimizer, WarmupCosine(warmup, total, min_lr_ratio))
