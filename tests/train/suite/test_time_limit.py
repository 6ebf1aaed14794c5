"""hybrid.train.suite.time_limit: a suite stopped between runs before its time limit, continued by the next call."""
from __future__ import annotations

import pytest

from hybrid.train.suite import RunSpec, TimeLimit, run_suite


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_run_starts_only_if_the_longest_so_far_fits(tmp_path):
    clock = Clock()

    def execute(spec, run_dir, advance):  # each run takes 100 s of the clock
        clock.now += 100
        return {"seed": spec.seed}

    specs = [RunSpec(run=f"m/seed{s}", model="m", seed=s) for s in range(4)]
    limit = TimeLimit(240, clock=clock)
    clock.now += 20  # the command's set-up counts
    records = run_suite(tmp_path, specs, execute, suite="t", verbose=False, time_limit=limit)
    assert [r["run"] for r in records] == ["m/seed0", "m/seed1"]  # then 20 s left, fewer than 100: stop
    assert limit.left_runs == 2 and limit.longest == 100
    assert limit.describe() == "2 runs left after 4 minutes (the longest run took 100 s, 20 s were left)"

    # the next command continues where this one stopped
    again = run_suite(tmp_path, specs, execute, suite="t", verbose=False, time_limit=TimeLimit(240, clock=clock))
    assert [r["run"] for r in again] == [s.run for s in specs] and again[:2] == records


def test_the_first_run_starts_unless_the_time_is_spent(tmp_path):
    clock = Clock()
    limit = TimeLimit(60, clock=clock)
    assert limit.fits()
    clock.now = 61
    assert not limit.fits()
    specs = [RunSpec(run="m/seed0", model="m", seed=0)]
    assert run_suite(tmp_path, specs, lambda *a: {}, suite="t", verbose=False, time_limit=limit) == []
    assert limit.left_runs == 1
    with pytest.raises(ValueError, match=r"^seconds: expected a positive time limit, got 0$"):
        TimeLimit(0)
