"""Experiment tracking: every ``metrics.jsonl`` record, and the run's config as hyperparameters, to TensorBoard
and / or Weights & Biases (``--log tensorboard --log wandb``).

    trackers = open_trackers(["tensorboard"], "runs/mine", config.to_dict())
    trackers.log({"step": 10, "loss": 2.31, "lr": 0.002})    # a metrics.jsonl record, as written there
    trackers.close()

- **TensorBoard** (extra ``tensorboard``): event files in ``RUN_DIR/tensorboard/`` (``tensorboard --logdir runs``);
  each record's numbers are scalars under their ``metrics.jsonl`` names (``loss``, ``val_bpb``, …) at its
  ``step``; the config is written once as hyperparameters (the HParams tab; nested keys as ``model.window``)
  and as JSON text. A resumed run purges the events after its checkpoint's step, as ``metrics.jsonl`` does.
- **Weights & Biases** (extra ``wandb``): ``wandb.init(dir=RUN_DIR, config=...)`` with the project from
  ``WANDB_PROJECT`` (default ``hybrid``), the run named after the run directory and its id kept in
  ``RUN_DIR/wandb/hybrid-run-id``, so a resumed run continues the same W&B run. Each record is one
  ``run.log`` with ``step`` as its x-axis. ``WANDB_MODE=offline`` works without an account or a network
  (``wandb sync`` uploads later).

``hybrid-train`` logs while it trains. ``hybrid-bench`` and ``hybrid-synthetic`` log each finished run of a
suite (or the one ``--task`` run) from its ``metrics.jsonl`` and results, once: ``replay_run`` skips a run
whose tracker folder already exists, so a resumed suite adds only its new runs. Only rank 0 logs.
"""
from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path

__all__ = ["TRACKERS", "Trackers", "open_trackers", "replay_run", "flatten", "TENSORBOARD_DIR", "WANDB_DIR"]

TRACKERS = ("tensorboard", "wandb")  # the experiment trackers --log names
TENSORBOARD_DIR, WANDB_DIR = "tensorboard", "wandb"
_RUN_ID_FILE = "hybrid-run-id"


def flatten(d: dict, prefix: str = "", sep: str = ".") -> dict:
    """``{"model": {"window": 64}}`` → ``{"model.window": 64}``."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name, sep))
        else:
            out[name] = value
    return out


def _numbers(record: dict) -> dict:
    """The finite real numbers of a record, ``step`` left out."""
    return {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def _need(package: str, kind: str):
    try:
        return __import__(package)
    except ImportError:
        raise ImportError(f"log: expected the {package} package for --log {kind}, got none installed; pip install "
                          f"'hybrid-lm[{kind}]' (or -e '.[{kind}]' in the checkout)") from None


class _TensorBoard:
    def __init__(self, run_dir: Path, config: dict, *, resume_step: int | None, summary: dict | None = None):
        _need("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        purge = None if resume_step is None else resume_step + 1
        first = resume_step is None or not any((run_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge)
        if first:  # the hyperparameters once per run (or when --log is first given on a resume), not on every resume
            params = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v)
                      for k, v in flatten(config).items()}
            metrics = {f"final/{k}": v for k, v in _numbers(flatten(summary or {}, sep="/")).items()}
            for summary_pb in hparams(params, metrics):  # the HParams tab, in this run's own event file
                self.writer._get_file_writer().add_summary(summary_pb)
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)
            self._summary = metrics
        else:
            self._summary = {}

    def log(self, record: dict) -> None:
        step = int(record.get("step", 0))
        for key, value in _numbers(record).items():
            self.writer.add_scalar(key, value, step)

    def close(self, last_step: int | None = None) -> None:
        for key, value in self._summary.items():
            self.writer.add_scalar(key, value, last_step or 0)
        self.writer.close()


class _Wandb:
    def __init__(self, run_dir: Path, config: dict, *, resume_step: int | None, summary: dict | None = None,
                 group: str | None = None):
        wandb = _need("wandb", "wandb")
        folder = run_dir / WANDB_DIR
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / _RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume_step is not None and id_file.is_file() else None
        run_id = run_id or secrets.token_hex(4)  # W&B's id form: 8 lowercase characters
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "hybrid"), name=run_dir.name, id=run_id,
                              resume="allow", dir=str(run_dir), config=config, group=group,
                              allow_val_change=True,  # a resume may change --steps, --lr, …
                              settings=wandb.Settings(console="off", silent=True))
        id_file.write_text(run_id + "\n")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        if summary:
            self.run.summary.update(_numbers(flatten(summary, sep="/")))

    def log(self, record: dict) -> None:
        self.run.log({"step": int(record.get("step", 0)), **_numbers(record)})

    def close(self, last_step: int | None = None) -> None:
        self.run.finish()


class Trackers:
    """The trackers of one run; ``log(record)`` feeds each, ``close()`` flushes and ends them."""

    def __init__(self, trackers: list):
        self.trackers, self.last_step = trackers, None

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log(self, record: dict) -> None:
        self.last_step = record.get("step", self.last_step)
        for tracker in self.trackers:
            tracker.log(record)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close(self.last_step)


def open_trackers(kinds, run_dir, config: dict, *, resume_step: int | None = None, summary: dict | None = None,
                  group: str | None = None) -> Trackers:
    """The trackers ``kinds`` (a subset of ``TRACKERS``) for the run in ``run_dir``, its ``config`` logged as
    hyperparameters (and ``summary``, final numbers, as such); ``resume_step``: a run resumed from that step."""
    kinds = list(kinds or [])
    unknown = [k for k in kinds if k not in TRACKERS]
    if unknown:
        raise ValueError(f"log: expected trackers from {list(TRACKERS)}, got {unknown}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    opened = []
    try:
        for kind in dict.fromkeys(kinds):
            if kind == "tensorboard":
                opened.append(_TensorBoard(run_dir, config, resume_step=resume_step, summary=summary))
            else:
                opened.append(_Wandb(run_dir, config, resume_step=resume_step, summary=summary, group=group))
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)


def check_trackers(kinds) -> None:
    """An ImportError now, before any training, for a tracker whose package is missing."""
    for kind in dict.fromkeys(kinds or []):
        _need(kind, kind)


def replay_run(kinds, run_dir, config: dict, *, summary: dict | None = None, group: str | None = None) -> list[str]:
    """Log a finished run from its ``metrics.jsonl`` (and ``summary``, its final numbers) to each tracker of
    ``kinds`` that has not logged it yet (no ``tensorboard/`` or ``wandb/`` folder in ``run_dir``); returns
    the kinds it logged to."""
    from .metrics import METRICS_FILE, read_metrics

    run_dir = Path(run_dir)
    todo = [k for k in dict.fromkeys(kinds or [])
            if not (run_dir / (TENSORBOARD_DIR if k == "tensorboard" else WANDB_DIR)).exists()]
    if not todo:
        return []
    records = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
    trackers = open_trackers(todo, run_dir, config, summary=summary, group=group)
    try:
        for record in records:
            trackers.log(record)
    finally:
        trackers.close()
    return todo
