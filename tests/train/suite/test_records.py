"""hybrid.train.suite.records: the results log survives a torn last line."""
from __future__ import annotations

from hybrid.train.suite import ResultsLog


def test_results_log_skips_a_torn_line(tmp_path):
    log = ResultsLog(tmp_path)
    log.append({"run": "a", "metrics": {"x": 1}})
    with open(log.path, "a") as f:
        f.write('{"run": "b", "metr')  # a crash while appending
    assert [r["run"] for r in log.records()] == ["a"]


def test_records_name_the_commit_the_caller_gives_before_asking_git(monkeypatch):
    """A lent device's copy of the checkout has no .git of its own, and may sit inside another repository: the
    device commands pass the commit in $HYBRID_COMMIT."""
    import re

    from hybrid.train.suite.records import COMMIT_VARIABLE, git_commit

    monkeypatch.delenv(COMMIT_VARIABLE, raising=False)
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", git_commit())
    monkeypatch.setenv(COMMIT_VARIABLE, "24c4e84")
    assert git_commit() == "24c4e84"
