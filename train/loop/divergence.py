"""Divergence: a non-finite loss, gradient norm or weight never reaches a checkpoint.

Each step folds "loss or gradient norm not finite" into a flag on the device (``NonFiniteFlag``: no host sync
per step); the flag, and the weights themselves, are checked before every save and log (one sync there).
``on_nonfinite="stop"`` ends the run with a FloatingPointError naming the last good checkpoint and how to
continue it; ``"skip"`` reads the flag every step (one sync per step), drops that step's update (the data and
the schedule move on) and stops after ``MAX_SKIPS_IN_A_ROW`` skips in a row.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.distributed as dist

from ..parallel.distributed import DistEnv
from .checkpoint import kept_checkpoints

__all__ = ["NonFiniteFlag", "nonfinite_weights", "DivergenceGuard", "NONFINITE_POLICIES", "MAX_SKIPS_IN_A_ROW"]

NONFINITE_POLICIES = ("stop", "skip")
MAX_SKIPS_IN_A_ROW = 5  # on_nonfinite="skip": more consecutive non-finite steps than this end the run


class NonFiniteFlag:
    """The first step (1-based) whose loss or gradient norm was not finite, 0 while there is none: a float64
    scalar on the device, updated without a host sync."""

    def __init__(self, device: torch.device):
        self.first = torch.zeros((), dtype=torch.float64, device=device)

    def record(self, bad: torch.Tensor, step: int) -> None:
        """Fold in step ``step``'s ``bad`` (a 0-dim bool tensor); the first bad step is kept."""
        self.first = torch.where(bad & (self.first == 0), float(step), self.first)

    def mark(self, step: int) -> None:
        self.first.fill_(float(step))


def nonfinite_weights(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """1.0 (float64, on the parameters' device) when any weight holds a NaN or ±inf, else 0.0; a DTensor (FSDP)
    is read through its local shard."""
    finite = [torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all() for p in parameters]
    return (~torch.stack(finite).all()).double()


class DivergenceGuard:
    """A run's divergence policy (``on_nonfinite``) and its messages.

    ``lr`` is the run's peak learning rate (the message suggests a tenth of it); ``float16``: the run trains
    with a GradScaler, whose overflowing steps are routine (only the loss counts then). ``run`` names the run in
    the message ("training diverged: …"); ``advice(step, path)`` says how to go on from the last good checkpoint
    and ``restart()`` how to start again when there is none (the defaults: hybrid-train's).
    """

    def __init__(self, policy: str, *, device: torch.device, env: DistEnv, out: Path, lr: float, float16: bool,
                 run: str = "training", advice: Callable[[int, Path], str] | None = None,
                 restart: Callable[[], str] | None = None):
        self.policy, self.env, self.out, self.lr, self.float16 = policy, env, Path(out), lr, float16
        self.run, self.advice, self.restart = run, advice or self._resume_advice, restart
        self.flag = NonFiniteFlag(device)
        self.skipped, self.skips_in_a_row = 0, 0
        self.last_saved: tuple[int, Path] | None = None  # (step, path) of the newest good checkpoint of this run

    def after_backward(self, loss: torch.Tensor, norm: torch.Tensor | None, step: int) -> bool:
        """Step ``step``'s verdict: True when its update is to be dropped ("skip": every rank alike, one sync);
        under "stop" the step is folded into the flag and False returned."""
        bad = ~torch.isfinite(loss)
        if norm is not None and not self.float16:  # with a scaler, overflowing gradients are routine
            bad = bad | ~torch.isfinite(norm)
        if self.policy == "skip":
            return self.env.all_reduce(bad.double()).item() > 0
        self.flag.record(bad, step)
        return False

    def count(self, step: int, skipped: bool, say: Callable[[str], None]) -> None:
        """After step ``step``: count a skipped update (``say`` tells), or end a streak. A FloatingPointError once
        more than ``MAX_SKIPS_IN_A_ROW`` were skipped in a row."""
        if not skipped:
            self.skips_in_a_row = 0
            return
        self.skipped += 1
        self.skips_in_a_row += 1
        say(f"step {step:>6}  non-finite loss or gradient: update skipped ({self.skips_in_a_row} in a row, "
            f"{self.skipped} in this run)")
        if self.skips_in_a_row > MAX_SKIPS_IN_A_ROW:
            first = step - self.skips_in_a_row + 1
            self.flag.mark(first)
            raise FloatingPointError(self.message(
                f"{self.skips_in_a_row} steps in a row had a non-finite loss or gradient (from step {first}; "
                f"--on-nonfinite skip allows {MAX_SKIPS_IN_A_ROW})"))

    def check(self, step: int, weights: Iterable[torch.Tensor] | None = None) -> None:
        """Raise FloatingPointError (on every rank) if a step so far had a non-finite loss or gradient norm, or a
        weight of ``weights`` (when given) is not finite after step ``step``. One collective and one host sync."""
        flags = [self.flag.first] + ([nonfinite_weights(weights)] if weights is not None else [])
        first_bad, bad_weights = (self.env.all_reduce(torch.stack(flags), op=dist.ReduceOp.MAX).tolist() + [0.0])[:2]
        if first_bad:
            raise FloatingPointError(self.message(f"the loss or gradient norm was not finite at step "
                                                  f"{int(first_bad)}", first_bad=int(first_bad)))
        if bad_weights:
            raise FloatingPointError(self.message(f"the weights are not finite after step {step}"))

    def _resume_advice(self, step: int, path: Path) -> str:
        return (f"the last good checkpoint is {path} (step {step}): continue it with a lower learning rate, e.g. "
                f"hybrid-train --resume {self.out} --lr {self.lr / 10:g}, or a longer --warmup")

    def message(self, what: str, first_bad: int | None = None) -> str:
        """"training diverged: {what}; {the last good checkpoint and how to go on} ({hints})"."""
        if self.last_saved is None:
            where = "no checkpoint was written; " + (self.restart() if self.restart else
                                                     "start again with a lower --lr or a longer --warmup")
        else:
            step, path = self.last_saved
            where = self.advice(step, path)
            earlier = [(s, p) for s, p in kept_checkpoints(self.out) if s < step]
            if first_bad == step + 1 and earlier:  # the first step from those weights: they may be the cause
                where += (f"; if it fails again at once, resume the one before, {earlier[0][1]} "
                          f"(step {earlier[0][0]})")
        hints = ["--on-nonfinite skip drops isolated non-finite steps"] * (self.policy == "stop")
        hints += ["float16 overflows easily: --set dtype=bfloat16"] * self.float16
        return f"{self.run} diverged: {what}; {where}" + (f" ({'; '.join(hints)})" if hints else "")
