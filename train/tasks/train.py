"""Train one model on one synthetic task and score it: a small loop for labels at chosen positions.

    result = train_task(TaskRunConfig(task="parity", preset="vo-rnn", model={"rnn_phase": "data"}), "runs/p")

The loss is the cross-entropy at the labelled positions only (the model predicts ``labels[t]`` from position t's
output). Training data depends on the seed only, so every model of a suite sees the same sequences in the same
order; test data is the same for every model and seed (``TEST_SEED``).

Validation is fresh sequences of the training distribution (``valid_accuracy``, every labelled position) and,
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

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from hybrid.checks import check_int, check_number
from hybrid.models import PRESETS, SIZES, HybridConfig, HybridLM
from hybrid.rotary import set_phase_rounding

from ..loop.checkpoint import load_checkpoint, save_checkpoint
from ..parallel.device import check_device, resolve_device
from ..loop.optim import build_optimizer
from ..loop.saved_model import checkpoint_model
from ..loop.schedule import default_warmup, warmup_cosine
from . import make_task
from .base import IGNORE, Batch, Task, rng_of, scaled_accuracy
from .from_run import load_source_weights, source_config

TEST_SEED = 1_000_003
VALID_SEED = 2_000_003
VALID_LENGTH_FACTOR = 2  # the long validation length: this many times the longest training length
GROW_SPAN = 0.5  # grow_lengths_to: the fraction of the run over which the longest training length grows
TASK_FILE, RESULTS_FILE, METRICS_FILE = "task.json", "results.json", "metrics.jsonl"


@dataclass
class TaskRunConfig:
    """One training run on one task. ``model`` overrides any HybridConfig field of the preset at ``size``, or,
    with ``init_from``, of that run's model (preset and size then do not apply)."""

    task: str = "parity"
    task_params: dict = field(default_factory=dict)
    preset: str = "vo-rnn"
    size: str = "tiny"
    model: dict = field(default_factory=dict)
    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup: int | None = None  # None = default_warmup(steps) = min(100, steps // 10)
    curriculum_steps: int = 0  # the first steps train on the task's easiest setting (Task.curriculum_batch)
    grow_lengths_to: int = 0  # 0: off; else the longest training length grows to this (state tracking)
    phase_round_from: float = 0.0  # training rounds the angles (recurrence.phase_round) after this fraction of steps
    grad_clip: float | None = 1.0
    seed: int = 0
    eval_size: int = 512  # test sequences per test point
    log_every: int = 25
    device: str = "auto"
    init_from: str | None = None  # a trained LM's run directory: its model and weights, fine-tuned (from_run.py)

    def __post_init__(self):
        if self.init_from is not None:  # the source run's model: no preset, no size
            if not isinstance(self.init_from, str) or not self.init_from:
                raise ValueError(f"init_from: expected a run directory's path, got {self.init_from!r}")
        elif self.preset not in PRESETS:
            raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.init_from is None and self.size not in SIZES:
            raise ValueError(f"size: expected one of {list(SIZES)}, got {self.size!r}")
        for name in ("steps", "batch_size", "eval_size", "log_every"):
            setattr(self, name, check_int(name, getattr(self, name), low=1, what="a positive int"))
        check_number("lr", self.lr, low=0.0, low_open=True)
        check_number("weight_decay", self.weight_decay, low=0.0)
        check_number("grad_clip", self.grad_clip, low=0.0, allow_none=True)  # None or 0: no clipping
        check_device("device", self.device)
        if self.warmup is None:
            self.warmup = default_warmup(self.steps)
        for name in ("warmup", "curriculum_steps"):
            value = check_int(name, getattr(self, name), low=0, high=self.steps, what=f"an int in [0, steps={self.steps}]")
            setattr(self, name, value)
        task = make_task(self.task, **self.task_params)  # validates the task and its parameters
        check_number("phase_round_from", self.phase_round_from, low=0.0, high=1.0, high_open=True)
        self.grow_lengths_to = check_int("grow_lengths_to", self.grow_lengths_to, low=0)
        if self.grow_lengths_to:
            longest = task.longest_train_length
            if longest is None:
                raise ValueError(f"grow_lengths_to: expected 0 for {self.task} (no training lengths to grow), got "
                                 f"{self.grow_lengths_to}")
            if self.grow_lengths_to <= longest:
                raise ValueError(f"grow_lengths_to: expected 0 or a length > the longest training length {longest}, "
                                 f"got {self.grow_lengths_to}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

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


def evaluate_task(model: HybridLM, task: Task, eval_size: int, device: torch.device) -> dict:
    """Accuracy (raw and scaled) at every test point, on the shared test sequences. A task with an ``evaluate``
    method of its own scores itself (passkey: its test set, long sequences in chunked mode)."""
    model.eval()
    if hasattr(task, "evaluate"):
        return task.evaluate(model, eval_size, device)
    out = {"accuracy": {}, "scaled_accuracy": {}, "test_loss": {}}
    for i, point in enumerate(task.test_points()):
        acc, loss = accuracy(model, task.test_batch(point, eval_size, rng_of(TEST_SEED + i)), task.score, device)
        out["accuracy"][point] = acc
        out["scaled_accuracy"][point] = scaled_accuracy(acc, task.chance)
        out["test_loss"][point] = loss
    return out


def train_task(config: TaskRunConfig, out, *, on_step=None) -> dict:
    """Train, score and save into ``out``; returns the results (also written to ``out/results.json``).

    ``on_step(step, loss)`` is called after every optimizer step (progress bars).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = make_task(config.task, **config.task_params)
    (out / TASK_FILE).write_text(json.dumps(task.to_json(), indent=1))
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    model_config = config.model_config(task)
    model = HybridLM(model_config).to(device)
    if config.init_from is not None:
        load_source_weights(model, config.init_from)
    optimizer = build_optimizer(model, lr=config.lr, weight_decay=config.weight_decay)
    scheduler = warmup_cosine(optimizer, warmup=config.warmup, total=config.steps)
    rng = rng_of(config.seed)
    round_from = int(config.phase_round_from * config.steps)  # steps 1 … round_from train unrounded
    set_phase_rounding(model, round_from == 0)
    start, status, loss_value = time.perf_counter(), "finished", float("nan")
    with open(out / METRICS_FILE, "w") as metrics:
        for step in range(1, config.steps + 1):
            model.train()
            if step == round_from + 1 and round_from:
                set_phase_rounding(model, True)
            longest = config.longest_at(step, task)
            if step <= config.curriculum_steps:
                batch = task.curriculum_batch(config.batch_size, rng, step=step - 1, steps=config.curriculum_steps)
            elif longest is not None:
                batch = task.train_batch(config.batch_size, rng, longest=longest)
            else:
                batch = task.train_batch(config.batch_size, rng)
            logits, _ = model(batch.ids.to(device))
            loss = masked_loss(logits, batch.labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            scheduler.step()
            loss_value = loss.detach().item()
            if not math.isfinite(loss_value):
                status = "diverged"
                break
            if step % config.log_every == 0 or step == config.steps:
                metrics.write(json.dumps({"step": step, "loss": loss_value, "lr": scheduler.get_last_lr()[0]}) + "\n")
                metrics.flush()  # readable while the run trains, as hybrid-train's metrics.jsonl is
            if on_step is not None:
                on_step(step, loss_value)
    train_seconds = time.perf_counter() - start
    model.eval()
    valid_acc, valid_loss = accuracy(model, task.train_batch(config.eval_size, rng_of(VALID_SEED)), "all", device)
    valid_long = {}
    valid_length = config.valid_length(task)
    if valid_length is not None:  # past the training lengths, scored where the tests are
        batch = task.test_batch(str(valid_length), config.eval_size, rng_of(VALID_SEED + 1))
        long_acc, long_loss = accuracy(model, batch, task.score, device)
        valid_long = {"valid_length": valid_length, "valid_long_accuracy": long_acc, "valid_long_loss": long_loss}
    results = {
        "task": task.name, "status": status, "steps": step, "final_loss": loss_value,
        "valid_accuracy": valid_acc, "valid_loss": valid_loss, **valid_long, "chance": task.chance,
        "score": task.score,
        **evaluate_task(model, task, config.eval_size, device),
        "train_seconds": train_seconds, "parameters": model.num_parameters(exclude_embeddings=True),
        "device": str(device),
    }
    save_checkpoint(out, model_state=model.state_dict(), config=model_config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=None, data_state=None, step=step,
                    extra={"task": task.to_json(), "task_run": config.to_dict()})
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=1))
    if hasattr(task, "write_figures"):  # passkey: the run's needle-in-a-haystack heatmap
        task.write_figures(out, results)
    return results


def load_task_run(run_dir, device: str | torch.device = "cpu") -> tuple[HybridLM, Task]:
    """The trained model (eval mode) and the task of a ``train_task`` run directory."""
    ckpt = load_checkpoint(run_dir)
    spec = json.loads((Path(run_dir) / TASK_FILE).read_text())
    task = make_task(spec["task"], **spec["params"])
    return checkpoint_model(ckpt, device), task
