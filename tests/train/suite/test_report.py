"""hybrid.train.suite.report: mean ± std, ties, markdown tables, line plots."""
from __future__ import annotations

import pytest

from hybrid.train.suite import fmt_mean_std, is_tie, markdown_table, mean_std, plot_lines

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_pieces(tmp_path):
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5))
    assert fmt_mean_std([0.5]) == "0.500" and fmt_mean_std([]) == "–"
    assert fmt_mean_std([1.0, 3.0], digits=1) == "2.0 ± 1.4"
    assert is_tie([1.0, 3.0], [2.5]) and not is_tie([1.0, 1.0], [2.0])
    assert markdown_table(["a", "b"], [[1, "x|y"]]) == "| a | b |\n|---|---|\n| 1 | x\\|y |"
    path = plot_lines(tmp_path / "p.png", {"m": ([1, 2], [0.5, 0.7], [0.0, 0.1])}, xlabel="x", ylabel="y",
                      logx=True, hline=0.5)
    assert path.read_bytes()[:8] == PNG_MAGIC
