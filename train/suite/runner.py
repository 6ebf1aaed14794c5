"""Run a suite: every (model, seed, …) run into its own directory, one record per finished run, resumable.

    specs = [RunSpec(run="parity/vo-rnn/seed0", model="vo-rnn", seed=0, config={...}, steps=500), …]
    records = run_suite("runs/synth", specs, execute, suite="state-tracking")

``execute(spec, run_dir, advance)`` trains one run into ``run_dir`` and returns its metrics (a JSON-able dict);
it calls ``advance(n)`` as it makes progress (n of ``spec.steps`` units). A run already in ``results.jsonl`` is
skipped; a run directory without a record (a run interrupted halfway) is removed and the run starts over. With a
``TimeLimit``, a run starts only if it fits in the time left (``time_limit.py``); the runs left are counted there.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..output.progress import progress_bar
from .records import ResultsLog, git_commit, machine, now_utc
from .time_limit import TimeLimit


@dataclass(frozen=True)
class RunSpec:
    run: str  # unique within the suite; also the run directory, relative to the suite directory
    model: str  # the model's name in the suite (report rows)
    seed: int
    config: dict = field(default_factory=dict)  # everything that defines the run (recorded)
    steps: int = 1  # progress units of the suite's bar


def check_unique(specs: list[RunSpec]) -> None:
    seen = set()
    for s in specs:
        if s.run in seen:
            raise ValueError(f"specs: expected unique run names, got {s.run!r} twice")
        seen.add(s.run)


def run_suite(out, specs: list[RunSpec], execute: Callable, *, suite: str, verbose: bool = True,
              time_limit: TimeLimit | None = None, command: str | None = None) -> list[dict]:
    """Run what is not finished; return the records of ``specs``, in their order (those finished, when
    ``time_limit`` stopped the suite). With ``command``, each new record keeps it (the command line that trained
    the run, for a report rewritten from the records)."""
    out = Path(out)
    check_unique(specs)
    log = ResultsLog(out)
    done = log.by_run()
    todo = [s for s in specs if s.run not in done]
    commit, host = git_commit(), machine()
    total = sum(s.steps for s in specs)
    # a tqdm bar on a terminal, plain lines in a log file (hybrid.train.output.progress)
    bar = progress_bar(total=total, initial=total - sum(s.steps for s in todo), desc=suite, unit="step",
                       disable=not verbose)
    if time_limit is not None:
        time_limit.left_runs = 0
    try:
        for i, spec in enumerate(todo):
            if time_limit is not None:
                if not time_limit.fits():
                    time_limit.left_runs = len(todo) - i
                    break
                time_limit.begin()
            run_dir = out / spec.run
            if run_dir.exists():  # interrupted halfway: no record, so it starts over
                shutil.rmtree(run_dir)
            bar.set_postfix_str(spec.run, refresh=True)
            start = time.perf_counter()
            advanced = 0

            def advance(n: int = 1) -> None:
                nonlocal advanced
                n = min(n, spec.steps - advanced)
                advanced += n
                bar.update(n)

            metrics = execute(spec, run_dir, advance)
            advance(spec.steps)  # a run that stopped early (diverged) still completes its share of the bar
            record = {"run": spec.run, "suite": suite, "model": spec.model, "seed": spec.seed,
                      "config": spec.config, "metrics": metrics, "commit": commit, "machine": host,
                      "finished_at": now_utc(), "seconds": round(time.perf_counter() - start, 3)}
            log.append(record if command is None else {**record, "command": command})
            if time_limit is not None:
                time_limit.end()
    finally:
        bar.close()
    records = log.by_run()
    return [records[s.run] for s in specs if s.run in records]
