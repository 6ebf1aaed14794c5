"""hybrid.train.suite.records: the results log survives a torn last line."""
from __future__ import annotations

from hybrid.train.suite import ResultsLog


def test_results_log_skips_a_torn_line(tmp_path):
    log = ResultsLog(tmp_path)
    log.append({"run": "a", "metrics": {"x": 1}})
    with open(log.path, "a") as f:
        f.write('{"run": "b", "metr')  # a crash while appending
    assert [r["run"] for r in log.records()] == ["a"]
