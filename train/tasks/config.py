"""TaskRunConfig: one model trained on one synthetic task (``hybrid.train.tasks.train``), validated on construction.

Its options are the model's and the optimizer's sections (``hybrid.train.options.sections``) and the loop's, data's
and execution's that a task run takes (``steps``, ``seed``, ``log_every``, ``batch_size``, ``device``, each
redeclared with a task run's default), plus the task's own. ``model`` overrides any HybridConfig field of the
preset at ``size``, or, with ``init_from``, of that run's model (preset and size then do not apply).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hybrid.checks import check_int, check_number
from hybrid.models import PRESETS, SIZES, HybridConfig

from ..loop.schedule import default_warmup
from ..options.checks import OfType, a_dict, whole
from ..options.fields import option, redeclare
from ..options.record import RunConfig
from ..options.sections import DataOptions, ExecutionOptions, LoopOptions, ModelOptions, OptimizerOptions
from . import make_task
from .base import Task
from .from_run import source_config

__all__ = ["TaskRunConfig", "VALID_LENGTH_FACTOR", "GROW_SPAN"]

VALID_LENGTH_FACTOR = 2  # the long validation length: this many times the longest training length
GROW_SPAN = 0.5  # grow_lengths_to: the fraction of the run over which the longest training length grows


@dataclass
class TaskRunConfig(RunConfig, OptimizerOptions, ModelOptions):
    """One training run on one task."""

    KIND: ClassVar[str] = "task run config"

    task: str = option("parity", "task", check=OfType(str, "a task name"), help="the task")
    task_params: dict = option({}, "task", check=a_dict, flag=False, help="the task generator's parameters")
    preset: str | None = redeclare(ModelOptions, "preset", "vo-rnn", check=None)  # None with init_from: _check
    size: str | None = redeclare(ModelOptions, "size", check=None)
    lr: float = redeclare(OptimizerOptions, "lr", 1e-3)
    steps: int = redeclare(LoopOptions, "steps", help="optimizer steps")
    batch_size: int = redeclare(DataOptions, "batch_size", 64, help="sequences per step")
    curriculum_steps: int = option(0, "task", check=whole(0), metavar="N",
                                   help="the first N steps train on the task's easiest setting (Task.curriculum_batch)")
    grow_lengths_to: int = option(0, "task", check=whole(0), help="0: off; else the longest training length grows "
                                                                  "to this over the first half of the run")
    phase_round_from: float = option(0.0, "task", help="training rounds the angles "
                                     "(recurrence.phase_round) after this fraction of the steps")
    seed: int = redeclare(LoopOptions, "seed")
    eval_size: int = option(512, "task", check=whole(1), help="test sequences per test point")
    log_every: int = redeclare(LoopOptions, "log_every", 25)
    device: str = redeclare(ExecutionOptions, "device")

    def _check(self) -> None:
        if self.init_from is not None:  # the source run's model: no preset, no size
            if not self.init_from:
                raise ValueError(f"init_from: expected a run directory's path, got {self.init_from!r}")
        elif self.preset not in PRESETS:
            raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.init_from is None and self.size not in SIZES:
            raise ValueError(f"size: expected one of {list(SIZES)}, got {self.size!r}")
        if self.warmup is None:
            self.warmup = default_warmup(self.steps)
        for name in ("warmup", "curriculum_steps"):
            value = check_int(name, getattr(self, name), low=0, high=self.steps,
                              what=f"an int in [0, steps={self.steps}]")
            setattr(self, name, value)
        task = make_task(self.task, **self.task_params)  # validates the task and its parameters
        check_number("phase_round_from", self.phase_round_from, low=0.0, high=1.0, high_open=True)
        if self.grow_lengths_to:
            longest = task.longest_train_length
            if longest is None:
                raise ValueError(f"grow_lengths_to: expected 0 for {self.task} (no training lengths to grow), got "
                                 f"{self.grow_lengths_to}")
            if self.grow_lengths_to <= longest:
                raise ValueError(f"grow_lengths_to: expected 0 or a length > the longest training length {longest}, "
                                 f"got {self.grow_lengths_to}")

    def valid_length(self, task: Task) -> int | None:
        """The long validation length: twice the longest length trained on (after any growth); None for a task
        that is not tested past its training lengths."""
        longest = task.longest_train_length
        if longest is None:
            return None
        return VALID_LENGTH_FACTOR * max(longest, self.grow_lengths_to)

    def longest_at(self, step: int, task: Task) -> int | None:
        """The longest training length at ``step`` (1-based) under ``grow_lengths_to``; None: the task's own."""
        if not self.grow_lengths_to:
            return None
        longest = task.longest_train_length
        done = min(1.0, step / max(1.0, GROW_SPAN * self.steps))
        return int(round(longest + (self.grow_lengths_to - longest) * done))

    def model_config(self, task: Task) -> HybridConfig:
        if self.init_from is not None:
            return source_config(self.init_from, task, self.model)
        overrides = {"vocab_size": task.vocab_size, **self.model}
        return HybridConfig.preset(self.preset, self.size, **overrides)
