"""hybrid.train.suite.runner: records, finished runs skipped, a half-done run restarted, unique run names."""
from __future__ import annotations

import pytest

from hybrid.train.suite import ResultsLog, RunSpec, run_suite


def test_run_suite_records_skips_finished_and_restarts_a_half_run(tmp_path):
    calls = []

    def execute(spec, run_dir, advance):
        calls.append(spec.run)
        run_dir.mkdir(parents=True)
        (run_dir / "done").write_text("x")
        advance(spec.steps)
        return {"value": spec.seed * 10}

    specs = [RunSpec(run=f"m/seed{s}", model="m", seed=s, config={"seed": s}, steps=3) for s in range(3)]
    records = run_suite(tmp_path, specs, execute, suite="t", verbose=False)
    assert calls == ["m/seed0", "m/seed1", "m/seed2"]
    assert [r["metrics"]["value"] for r in records] == [0, 10, 20]
    for key in ("config", "seed", "metrics", "commit", "machine", "finished_at", "seconds"):
        assert key in records[0]
    assert records[0]["machine"]["cpus"] >= 1 and records[0]["commit"]

    # a second invocation runs nothing; a run interrupted halfway (directory, no record) starts over
    lines = ResultsLog(tmp_path).path.read_text().splitlines()
    ResultsLog(tmp_path).path.write_text("\n".join(lines[:2]) + "\n")
    (tmp_path / "m/seed2/partial").write_text("half")
    calls.clear()
    again = run_suite(tmp_path, specs, execute, suite="t", verbose=False)
    assert calls == ["m/seed2"]
    assert not (tmp_path / "m/seed2/partial").exists()
    assert again[:2] == records[:2]
    with pytest.raises(ValueError, match=r"specs: expected unique run names"):
        run_suite(tmp_path, specs + specs[:1], execute, suite="t", verbose=False)


def test_each_new_record_keeps_the_command_that_trained_it(tmp_path):
    """hybrid-bench --report-only names the records' commands, not its own."""
    def execute(spec, run_dir, advance):
        return {}

    specs = [RunSpec(run=f"m/seed{s}", model="m", seed=s) for s in range(2)]
    run_suite(tmp_path, specs[:1], execute, suite="t", verbose=False)
    records = run_suite(tmp_path, specs, execute, suite="t", verbose=False, command="bench --seeds 0,1")
    assert "command" not in records[0] and records[1]["command"] == "bench --seeds 0,1"
