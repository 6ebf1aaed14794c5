"""The context-parallel suite's process groups: three processes started once per test session.

`ranks.py` (beside this file) is one rank: it joins a gloo group through a file store (no port to pick, so no
race for one), runs every case of `cases_kernels.py` (the ops) and `cases_layers.py` (the mixers and the models)
on the three ranks and then on two of them, and writes its errors. Starting the processes is the slow part on a
2-core CI machine (torch's import), so the ops, mixers and models share one start; the tests read the results.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RANKS = Path(__file__).with_name("ranks.py")
WORLD = 3  # the cases run on 3 ranks, then on 2 of them
TIMEOUT_S = 600


@pytest.fixture(scope="session")
def cp_results(tmp_path_factory) -> dict[int, dict[str, list[dict]]]:
    """``{group size: {case: [checks of rank 0, rank 1, …]}}``, each ``{check: relative error}`` or
    ``{"error": traceback}``."""
    folder = tmp_path_factory.mktemp("context_parallel")
    store, out = folder / "store", folder / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(RANKS), str(rank), str(WORLD), str(store), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(WORLD)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for proc in procs:  # a rank that hung (a collective without its peers) is stopped, not left behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        if proc.returncode != 0:
            pytest.fail(f"rank {rank} of the context-parallel suite exited with {proc.returncode}:\n{log[-4000:]}")
    results: dict[int, dict[str, list[dict]]] = {}
    for rank in range(WORLD):
        for size, cases in json.loads((folder / f"out.{rank}.json").read_text()).items():
            for name, checks in cases.items():
                results.setdefault(int(size), {}).setdefault(name, []).append(checks)
    return results
