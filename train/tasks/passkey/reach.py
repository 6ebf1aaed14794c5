"""How far back a passkey run finds its key: exact match and per-digit accuracy by the key's distance to the query.

A run's test grid (``results.json``: every length × depth cell, ``samples`` sequences each) holds the same distance
at many lengths: a key 200 tokens before the query at 8192 tokens is depth 0.98 there and depth 0.2 at 256. Grouping
the cells by ``Passkey.key_distance`` (tokens from the key's last digit to the query marker) into buckets
``(lo, hi]`` separates the two things a heatmap mixes, how far the key is and how much filler came before it:

    python -m hybrid.train.cli.studies.passkey_reach runs/pk/a runs/pk/b [--edges 32,64,128,256,512,1024,2048,4096,8192]
    python -m hybrid.train.cli.studies.passkey_reach runs/pk/a --yarn      # the same test set read with YaRN
    python -m hybrid.train.cli.studies.passkey_reach runs/pk/a --yarn --by length    # per test length instead
    python -m hybrid.train.cli.studies.passkey_reach runs/pk/a --yarn --by cell --samples 16 --seed 1    # every cell, afresh

Each bucket is the mean over its cells (each cell the mean of its sequences), with the number of sequences.
By default nothing is run again: the figures are the run's own test results. ``--yarn`` scores the run's model
again (``score_passkey(rope_scaling="yarn")``: each length L above the training length read at YaRN factor
L / train_length, which rescales the rotary angles of the attention and of the R layers alike). ``--samples N``
and ``--seed S`` score it again on a fresh test grid of the same lengths and depths, N sequences per cell drawn
from seed S (the run's own grid has ``samples`` per cell, often 4, so that one sequence moves a cell by 0.25).
``--by cell`` prints the grid itself, exact match per length and depth.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import make_task
from ..train import RESULTS_FILE, TASK_FILE

__all__ = ["reach_buckets", "length_rows", "cell_rows", "run_reach", "check_passkey_run", "EDGES", "GROUPINGS"]

EDGES = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
GROUPINGS = ("distance", "length", "cell")


def reach_buckets(task, grid: dict, edges=EDGES) -> list[dict]:
    """``grid``: a run's ``results["passkey"]`` (``lengths``, ``depths``, ``samples``, ``exact`` and ``digit`` as
    ``[length][depth]``). One dict per bucket ``(lo, hi]`` of ``edges`` (the first from 0, the last open above, as
    ``> edges[-1]``) that holds a cell: ``label``, ``sequences``, ``exact``, ``digit`` (means over its sequences)."""
    bounds = [0, *edges]
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"edges: expected increasing positive distances, got {list(edges)}")
    sums: dict[int, list[float]] = {}
    for i, length in enumerate(grid["lengths"]):
        for j, depth in enumerate(grid["depths"]):
            distance = task.key_distance(length, depth)
            b = next((n for n, hi in enumerate(edges) if distance <= hi), len(edges))
            acc = sums.setdefault(b, [0.0, 0.0, 0.0])
            acc[0] += grid["samples"]
            acc[1] += grid["exact"][i][j] * grid["samples"]
            acc[2] += grid["digit"][i][j] * grid["samples"]
    out = []
    for b in sorted(sums):
        n, exact, digit = sums[b]
        label = f"> {edges[-1]}" if b == len(edges) else f"{bounds[b] + 1}–{bounds[b + 1]}"
        hi = float("inf") if b == len(edges) else edges[b]
        out.append({"label": label, "hi": hi, "sequences": int(n), "exact": exact / n, "digit": digit / n})
    return out


def length_rows(grid: dict) -> list[dict]:
    """The same figures per test length (the mean over its depths), as ``reach_buckets`` gives them per distance:
    ``label`` (the length), ``sequences``, ``exact``, ``digit``."""
    n = grid["samples"] * len(grid["depths"])
    return [{"label": str(length), "hi": length, "sequences": n, "exact": sum(grid["exact"][i]) / len(grid["depths"]),
             "digit": sum(grid["digit"][i]) / len(grid["depths"])} for i, length in enumerate(grid["lengths"])]


def cell_rows(task, grid: dict) -> list[dict]:
    """Every cell of the grid, length-major: ``label`` (``"length@depth"``), ``length``, ``depth``, ``distance``
    (``Passkey.key_distance``), ``sequences``, ``exact``, ``digit``, ``loss`` (the answer's cross-entropy)."""
    return [{"label": f"{length}@{depth:g}", "length": length, "depth": depth,
             "distance": task.key_distance(length, depth), "sequences": grid["samples"],
             "exact": grid["exact"][i][j], "digit": grid["digit"][i][j], "loss": grid["loss"][i][j]}
            for i, length in enumerate(grid["lengths"]) for j, depth in enumerate(grid["depths"])]


def run_reach(run_dir, edges=EDGES, *, yarn: bool = False, device="cpu", by: str = "distance",
              samples: int | None = None, seed: int | None = None) -> list[dict]:
    """``reach_buckets`` (``by="distance"``), ``length_rows`` (``by="length"``) or ``cell_rows`` (``by="cell"``) of
    a passkey run directory: its task.json and results.json; or its model scored again on ``device``, with YaRN at
    each test length (``yarn``) and/or on a fresh grid of ``samples`` sequences per cell drawn from ``seed``
    (either one alone keeps the other as the run has it)."""
    if by not in GROUPINGS:
        raise ValueError(f"by: expected one of {list(GROUPINGS)}, got {by!r}")
    task, grid = _run_grid(run_dir, yarn, device, samples, seed)
    if by == "distance":
        return reach_buckets(task, grid, edges)
    return length_rows(grid) if by == "length" else cell_rows(task, grid)


def check_passkey_run(run_dir) -> tuple[dict, dict]:
    """(task.json, results.json) of a finished passkey run directory; a one-line error for anything else."""
    run = Path(run_dir)
    try:
        stored = json.loads((run / TASK_FILE).read_text())
        results = json.loads((run / RESULTS_FILE).read_text())
    except FileNotFoundError as e:
        raise ValueError(f"run: expected a finished hybrid-synthetic run directory, got {run_dir} ({e.strerror}: "
                         f"{Path(e.filename).name})") from None
    if stored.get("task") not in ("passkey", "passkey-text") or "passkey" not in results:
        raise ValueError(f"run: expected a passkey run directory, got a {stored.get('task')} run at {run_dir}")
    return stored, results


def _run_grid(run_dir, yarn: bool, device, samples: int | None = None, seed: int | None = None):
    """(the task, its test grid) of a passkey run directory; the grid scored again with YaRN if ``yarn``, on a
    fresh test set if ``samples`` or ``seed``."""
    run = Path(run_dir)
    stored, results = check_passkey_run(run)
    if not yarn and samples is None and seed is None:
        return make_task(stored["task"], **stored["params"]), results["passkey"]
    from .scoring import score_passkey
    from ..train import load_task_run

    model, task = load_task_run(run, device)
    if samples is not None or seed is not None:
        fresh = {"samples": task.samples if samples is None else samples,
                 "test_seed": task.test_seed if seed is None else seed}
        task = make_task(task.name, **{**task.params(), **fresh})
    return task, score_passkey(model, task, device, rope_scaling="yarn" if yarn else None)["passkey"]
