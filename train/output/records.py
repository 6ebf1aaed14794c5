"""Where a run's records go: ``metrics.jsonl``, the experiment trackers, the run's history and its callbacks.

    log = RunLog(out, trackers=["tensorboard"], config=config.to_dict(), resume_step=None, is_main=True)
    log.train({"step": 10, "loss": 2.31, "lr": 0.002, "tokens_per_s": 9000.0})
    log.eval({"step": 10, "val_loss": 2.2, "val_bpb": 1.4})
    log.close()

Rank 0 alone writes (the file, the trackers) and calls ``on_log`` (every training record) and ``on_eval`` (every
evaluation record); every rank keeps the records in ``history`` (their figures are the ranks' combined ones). A
resumed run (``resume_step``) keeps the file's records up to its checkpoint and replaces the rest, and the
trackers purge theirs likewise (``hybrid.train.output``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .metrics import MetricsLogger
from .tracking import open_trackers

__all__ = ["RunLog"]


class RunLog:
    def __init__(self, out: Path, *, trackers: list, config: dict, resume_step: int | None, is_main: bool,
                 on_log: Callable[[dict], None] | None = None, on_eval: Callable[[dict], None] | None = None):
        self.is_main, self.on_log, self.on_eval = is_main, on_log, on_eval
        self.history: list[dict] = []
        self.metrics = self.tracker = None
        if is_main:
            out.mkdir(parents=True, exist_ok=True)
            self.metrics = MetricsLogger(out, resume_step=resume_step)
            self.tracker = open_trackers(trackers, out, config, resume_step=resume_step)

    def train(self, record: dict) -> None:
        self._write(record, self.on_log)

    def eval(self, record: dict) -> None:
        self._write(record, self.on_eval)

    def holds(self, step: int, key: str) -> bool:
        """Whether the file's records kept on resume hold one at ``step`` with ``key`` (rank 0: the others have no
        file and answer False)."""
        return self.metrics is not None and any(r.get("step") == step and key in r for r in self.metrics.kept)

    def _write(self, record: dict, callback) -> None:
        self.history.append(record)
        if self.is_main:
            self.metrics.log(**record)
            self.tracker.log(record)
            if callback is not None:
                callback(record)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.tracker is not None:
            self.tracker.close()
