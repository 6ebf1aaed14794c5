"""Train one model on one synthetic task and score it: a small loop for labels at chosen positions.

    result = train_task(TaskRunConfig(task="parity", preset="vo-rnn", model={"rnn_phase": "data"}), "runs/p")

The loss is the cross-entropy at the labelled positions only (the model predicts ``labels[t]`` from position t's
output). Training data depends on the seed only, so every model of a suite sees the same sequences in the same
order; test data is the same for every model and seed (``TEST_SEED``).

Validation is fresh sequences of the training distribution (``valid_accuracy``, every labelled position; MQAR's
the mean over its grid points, ``Task.valid_batches``) and,
for a task tested past its training lengths (state tracking), fresh sequences at twice the longest training
length (``valid_long_accuracy`` at the scored position, ``valid_length``): a model that fits the training
lengths but drifts beyond them is seen there, and a suite picks its learning rate on it. Neither is a test
length's sequences (``VALID_SEED``).

Options for state tracking: ``grow_lengths_to`` (a length curriculum: the longest training length grows linearly
to it over the first half of the run) and ``phase_round_from`` (the fraction of the steps after which a model
with ``recurrence.phase_round`` starts rounding its angles in training; before, it trains unrounded).

The run directory holds ``checkpoint/`` (``hybrid.train.loop.checkpoint.load_checkpoint`` opens it; the task and this
config ride in its ``extra``), ``task.json`` (the token map), ``results.json`` (accuracy per test point) and
``metrics.jsonl`` (the loss curve).
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hybrid.models import HybridLM
from hybrid.rotary import set_phase_rounding

from ..loop.checkpoint import load_checkpoint
from ..loop.divergence import DivergenceGuard
from ..loop.loop import Cadence, TrainingLoop
from ..loop.optim import build_optimizer
from ..loop.parts import Record, RNGPart
from ..output.records import RunLog
from ..loop.run import Run, precision
from ..loop.saved_model import checkpoint_model
from ..loop.schedule import warmup_cosine
from ..loop.stage import Stage
from ..parallel.device import resolve_device
from . import make_task
from .base import IGNORE, Batch, Task, rng_of, scaled_accuracy
from .config import TaskRunConfig
from .from_run import load_source_weights

__all__ = ["TaskRunConfig", "TaskStage", "train_task", "load_task_run", "evaluate_task", "accuracy", "masked_loss",
           "scored_positions", "task_autocast", "TEST_SEED", "VALID_SEED", "TASK_FILE", "RESULTS_FILE", "METRICS_FILE"]

TEST_SEED = 1_000_003
VALID_SEED = 2_000_003
TASK_FILE, RESULTS_FILE, METRICS_FILE = "task.json", "results.json", "metrics.jsonl"


def masked_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled positions. logits ``(N, T, V)``, labels ``(N, T)``."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)


def scored_positions(labels: torch.Tensor, score: str) -> torch.Tensor:
    """Boolean ``(N, T)``: every labelled position ("all"), or the last labelled one of each row ("last")."""
    labelled = labels != IGNORE
    if score == "all":
        return labelled
    last = labelled.size(1) - 1 - labelled.flip(1).int().argmax(1)  # (N,) index of the last labelled position
    mask = torch.zeros_like(labelled)
    mask[torch.arange(labels.size(0)), last] = True
    return mask & labelled


def task_autocast(device: torch.device, dtype: str):
    """The autocast a task run's forward passes take: bf16 on CUDA for a float32 model, as hybrid-train
    (``precision``); a model of another dtype, and the CPU, none."""
    return precision(device)[0] if dtype == "float32" else contextlib.nullcontext


@torch.no_grad()
def accuracy(model: HybridLM, batch: Batch, score: str, device: torch.device, chunk: int = 128) -> tuple[float, float]:
    """(accuracy at the scored positions, mean loss at the labelled ones) of ``model`` on ``batch``."""
    hits = total = 0
    loss_sum = loss_n = 0.0
    for start in range(0, batch.ids.size(0), chunk):
        ids = batch.ids[start : start + chunk].to(device)
        labels = batch.labels[start : start + chunk].to(device)
        logits, _ = model(ids)  # (n, T, V)
        mask = scored_positions(labels, score)
        hits += int((logits.argmax(-1) == labels)[mask].sum())
        total += int(mask.sum())
        n_labelled = int((labels != IGNORE).sum())
        loss_sum += float(masked_loss(logits, labels)) * n_labelled
        loss_n += n_labelled
    return hits / max(total, 1), loss_sum / max(loss_n, 1)


def majority_accuracy(labels: torch.Tensor, score: str) -> float:
    """The accuracy of always giving the most common answer at the scored positions of ``labels`` ``(N, T)``: the
    floor a model must clear when answers are not uniform (mod 5's left-to-right products absorb into 0)."""
    answers = labels[scored_positions(labels, score)]
    return int(torch.bincount(answers).max()) / answers.numel() if answers.numel() else float("nan")


def evaluate_task(model: HybridLM, task: Task, eval_size: int, device: torch.device) -> dict:
    """Accuracy (raw and scaled) at every test point, on the shared test sequences, with the most common answer's
    own accuracy there (``majority_accuracy``). A task with an ``evaluate`` method of its own scores itself
    (passkey: its test set, long sequences in chunked mode)."""
    model.eval()
    if hasattr(task, "evaluate"):
        return task.evaluate(model, eval_size, device)
    out = {"accuracy": {}, "scaled_accuracy": {}, "test_loss": {}, "majority_accuracy": {}}
    for i, point in enumerate(task.test_points()):
        batch = task.test_batch(point, eval_size, rng_of(TEST_SEED + i))
        acc, loss = accuracy(model, batch, task.score, device)
        out["accuracy"][point] = acc
        out["scaled_accuracy"][point] = scaled_accuracy(acc, task.chance)
        out["test_loss"][point] = loss
        out["majority_accuracy"][point] = majority_accuracy(batch.labels, task.score)
    return out


class Diverged(Exception):
    """A task run's loss was not finite at the step it names: the run ends there."""


class GeneratorState:
    """The task's batch generator (a numpy ``Generator``) as a checkpoint part: its bit generator's state."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def state_dict(self) -> dict:
        return self.rng.bit_generator.state

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state


class TaskStage(Stage):
    """A synthetic task on the one loop: the loss at the labelled positions (``masked_loss``), batches drawn from a
    generator seeded by the run's seed alone (with the curriculum, the growing lengths and the angle rounding at
    their steps), validation on fresh sequences (``VALID_SEED``). Forward passes run under ``autocast`` (``precision``:
    bf16 on CUDA, as ``hybrid-train``; nothing on the CPU)."""

    name = "task"

    def __init__(self, config: TaskRunConfig, task: Task, model: HybridLM, device: torch.device,
                 autocast=contextlib.nullcontext):
        self.config, self.task, self.device, self.autocast = config, task, device, autocast
        self.model = self.train_model = model
        self.trainable = list(model.parameters())
        self.optimizer = build_optimizer(model, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas)
        self.scheduler = warmup_cosine(self.optimizer, warmup=config.warmup, total=config.steps,
                                       min_lr_ratio=config.min_lr_ratio)
        self.steps, self.generator = config.steps, GeneratorState(rng_of(config.seed))
        self.round_from = int(config.phase_round_from * config.steps)  # steps 1 … round_from train unrounded
        set_phase_rounding(model, self.round_from == 0)
        self.last_loss = float("nan")

    def micro_batches(self, step: int) -> list[Batch]:
        c, rng = self.config, self.generator.rng
        self.model.train()
        if step == self.round_from + 1 and self.round_from:
            set_phase_rounding(self.model, True)
        longest = c.longest_at(step, self.task)
        if step <= c.curriculum_steps:
            batch = self.task.curriculum_batch(c.batch_size, rng, step=step - 1, steps=c.curriculum_steps)
        elif longest is not None:
            batch = self.task.train_batch(c.batch_size, rng, longest=longest)
        else:
            batch = self.task.train_batch(c.batch_size, rng)
        self.tokens_per_step = batch.ids.numel()
        return [batch]

    def loss(self, batch: Batch):
        with self.autocast():
            logits, _ = self.model(batch.ids.to(self.device))
        return masked_loss(logits, batch.labels.to(self.device)), {}  # in float32

    def after_step(self, step: int, loss: torch.Tensor) -> None:
        self.last_loss = loss.item()
        if not math.isfinite(self.last_loss):
            raise Diverged(step)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Accuracy on fresh sequences of the training distribution (every labelled position) and, for a task
        tested past its training lengths, at twice the longest training length (the scored position)."""
        c, task, model = self.config, self.task, self.model
        model.eval()
        with self.autocast():
            figures = [accuracy(model, batch, "all", self.device)  # (accuracy, loss) of each batch
                       for batch in task.valid_batches(c.eval_size, rng_of(VALID_SEED))]
            out = {"valid_accuracy": sum(a for a, _ in figures) / len(figures),
                   "valid_loss": sum(loss for _, loss in figures) / len(figures)}
            valid_length = c.valid_length(task)
            if valid_length is not None:  # past the training lengths, scored where the tests are
                batch = task.test_batch(str(valid_length), c.eval_size, rng_of(VALID_SEED + 1))
                long_acc, long_loss = accuracy(model, batch, task.score, self.device)
                out.update(valid_length=valid_length, valid_long_accuracy=long_acc, valid_long_loss=long_loss)
        return out

    def eval_line(self, step: int, figures: dict) -> str:
        return f"step {step:>6}  valid_accuracy {figures['valid_accuracy']:.4f}"


class TaskRun(Run):
    """``train_task``'s run: the task, the model, the one loop; then the test points and ``results.json``."""

    Config = TaskRunConfig

    def __init__(self, config: TaskRunConfig, out, on_step=None):
        super().__init__(config, out=out, verbose=0, progress=False)
        self.on_step = on_step

    def _fit(self) -> dict:
        c, out = self.config, self.out
        out.mkdir(parents=True, exist_ok=True)
        task = make_task(c.task, **c.task_params)
        (out / TASK_FILE).write_text(json.dumps(task.to_json(), indent=1))
        device = resolve_device(c.device)
        torch.manual_seed(c.seed)
        model_config = c.model_config(task)
        model = HybridLM(model_config).to(device)
        if c.init_from is not None:
            load_source_weights(model, c.init_from)
        autocast = task_autocast(device, model_config.dtype)
        stage = TaskStage(c, task, model, device, autocast)
        parts = {"data": stage.generator, "rng": RNGPart(), "task": Record(task.to_json()),
                 "task_run": Record(c.to_dict())}
        self.loop = TrainingLoop(out, Cadence(c.log_every), grad_clip=c.grad_clip,
                                 divergence=DivergenceGuard("stop", device=device, env=self.env, out=out, lr=c.lr,
                                                            float16=False),
                                 env=self.env, device=device, console=self.console, parts=parts,
                                 model_config=model_config.to_dict, on_step=self._stepped(stage))
        self.loop.open(RunLog(out, trackers=[], config=c.to_dict(), resume_step=None, is_main=True))
        start, status = time.perf_counter(), "finished"
        try:
            valid = self.loop.train(stage)
        except (Diverged, FloatingPointError):  # the run ends; it is scored as it is, and not saved
            status, valid = "diverged", stage.evaluate()
        train_seconds = time.perf_counter() - start
        valid = {k: v for k, v in valid.items() if k != "step"}
        with autocast():
            scores = evaluate_task(model, task, c.eval_size, device)
        results = {
            "task": task.name, "status": status, "steps": self.loop.step, "final_loss": stage.last_loss, **valid,
            "chance": task.chance, "score": task.score, **scores,
            "train_seconds": train_seconds, "parameters": model.num_parameters(exclude_embeddings=True),
            "device": str(device),
        }
        (out / RESULTS_FILE).write_text(json.dumps(results, indent=1))
        if hasattr(task, "write_figures"):  # passkey: the run's needle-in-a-haystack heatmap
            task.write_figures(out, results)
        return results

    def _stepped(self, stage: TaskStage):
        if self.on_step is None:
            return None
        return lambda step: self.on_step(step, stage.last_loss)


def train_task(config: TaskRunConfig, out, *, on_step=None) -> dict:
    """Train, score and save into ``out``; returns the results (also written to ``out/results.json``).

    ``on_step(step, loss)`` is called after every optimizer step (progress bars).
    """
    return TaskRun(config, out, on_step).fit()


def load_task_run(run_dir, device: str | torch.device = "cpu") -> tuple[HybridLM, Task]:
    """The trained model (eval mode) and the task of a ``train_task`` run directory."""
    ckpt = load_checkpoint(run_dir)
    spec = json.loads((Path(run_dir) / TASK_FILE).read_text())
    task = make_task(spec["task"], **spec["params"])
    return checkpoint_model(ckpt, device), task
