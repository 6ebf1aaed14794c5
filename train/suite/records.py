"""``results.jsonl``: one JSON record per finished run, appended when the run ends, the suite's source of truth.

A record: ``{"run": id, "suite", "model", "seed", "config", "metrics", "commit", "machine", "finished_at",
"seconds"}``. A run whose record is present is finished; a second invocation skips it and reports from the
records. A torn last line (a crash while appending) is ignored on reading.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

RESULTS_FILE = "results.jsonl"


COMMIT_VARIABLE = "HYBRID_COMMIT"  # the commit of a copy without its own .git (a lent device's), as the caller knows it


def git_commit(where: str | os.PathLike | None = None) -> str:
    """``$HYBRID_COMMIT`` when set, else the commit of the repository holding this source file (``"unknown"``
    outside one), ``+dirty`` if modified. A device machine's copy of the checkout may sit inside another
    repository, whose commit is not this code's (2026-11-28: records named a commit of an earlier session)."""
    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]
    where = Path(where) if where is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def machine() -> dict:
    """Where the numbers come from: host, CPU count, accelerator, library versions."""
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "hostname": platform.node()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    if os.environ.get("HYBRID_COMPILE_CACHE"):  # set by hybrid.train.bench.compile_cache: compile seconds were warm
        info["compile_cache"] = os.environ["HYBRID_COMPILE_CACHE"]
    return info


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class ResultsLog:
    """The ``results.jsonl`` of one suite directory."""

    def __init__(self, directory: str | os.PathLike):
        self.path = Path(directory) / RESULTS_FILE

    def records(self) -> list[dict]:
        """Every complete record, in the order written (a later record of the same run wins in ``by_run``)."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from an interrupted append
            if isinstance(record, dict) and "run" in record:
                out.append(record)
        return out

    def by_run(self) -> dict[str, dict]:
        return {r["run"]: r for r in self.records()}

    def append(self, record: dict) -> None:
        """Append one record as one line, flushed and fsynced (a crash loses at most this line)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=str) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
