"""What every training suite shares (``hybrid-synthetic`` today, ``hybrid-bench`` next): named budgets, one run
directory per model and seed, ``results.jsonl`` with one record per finished run, skip-finished resume, one
progress bar over the suite, a time limit that stops it between runs, and ``report.md`` with PNG plots.

    budget = BUDGETS["cpu"].override(steps=200)          # a suite's table of Budget values
    print(budget.describe())
    records = run_suite(out, specs, execute, suite="state-tracking")
    write_report(out / "report.md", "# …", [markdown_table(headers, rows), "![](plot.png)"])
"""
from .budget import Budget, parse_int_list, parse_name_list
from .records import RESULTS_FILE, ResultsLog, git_commit, machine
from .report import fmt_mean_std, is_tie, markdown_table, mean_std, plot_lines, write_report
from .runner import RunSpec, run_suite
from .time_limit import TimeLimit

__all__ = [
    "Budget", "RESULTS_FILE", "ResultsLog", "RunSpec", "fmt_mean_std", "git_commit", "is_tie", "machine",
    "markdown_table", "mean_std", "parse_int_list", "parse_name_list", "plot_lines", "run_suite", "TimeLimit",
    "write_report",
]
