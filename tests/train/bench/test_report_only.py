"""hybrid-bench --report-only: the report's header describes the records (their budget and the commands that
trained them), not the flags of the command that rewrites it; flags naming another budget are refused. The
records are the two gpu-long runs of docs/bench (no training here)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hybrid.train.bench.budgets import recorded_budgets
from hybrid.train.bench.report import command_line, report_commands
from hybrid.train.cli.bench import bench_main, runs_left_out
from hybrid.train.suite import ResultsLog

GPU_LONG = Path(__file__).resolve().parents[3] / "docs" / "bench" / "gpu-long"
TRAINED_BY = "hybrid-bench --suite baselines --budget smoke --dry-run --out runs/dry"


def suite_dir(tmp_path: Path, *, name: str | None = None, command: str | None = None, report: str | None = None):
    """OUT/baselines holding the gpu-long records (renamed to budget ``name``, keeping ``command``) and, if
    given, a previous report.md whose command line is ``report``."""
    suite = tmp_path / "out" / "baselines"
    suite.mkdir(parents=True)
    records = [json.loads(line) for line in (GPU_LONG / "results.jsonl").read_text().splitlines()]
    for r in records:
        r["config"]["budget"]["name"] = name or r["config"]["budget"]["name"]
        if command is not None:
            r["command"] = command
    (suite / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if report is not None:
        (suite / "report.md").write_text(f"# hybrid-bench: baselines\n\nabout\n{report}\n- runs: 2\n")
    return suite


def header(suite: Path) -> str:
    """The generated report's header (what a person wrote above it left out)."""
    text = (suite / "report.md").read_text()
    return text[text.index("# hybrid-bench: "):].split("## ")[0]


def test_report_only_describes_the_records_budget_and_keeps_the_training_command(tmp_path, capsys):
    shutil.copy(GPU_LONG / "report.md", tmp_path / "previous.md")
    suite = suite_dir(tmp_path)
    shutil.copy(tmp_path / "previous.md", suite / "report.md")
    argv = ["--suite", "baselines", "--out", str(tmp_path / "out"), "--report-only"]
    assert bench_main(argv) == 0  # no --budget: the records' (not the default smoke)
    text = header(suite)
    assert "budget 'gpu-long':" in text and "steps       300" in text and "d_model     512" in text
    assert "budget 'smoke'" not in text and "budget 'gpu-long'" in capsys.readouterr().out
    run = ("hybrid-bench --suite baselines --budget gpu-long --models transformer,transformer-window,hybrid,"
           "hybrid-selective --data .corpus --compile --max-minutes {} --seeds {} --out runs/gpu-long --quiet")
    # the first from the previous report (the H100's records name none), then the records' own
    trained = (f"- commands: `{run.format(3, 0)}`; `{run.format(7, 0)}`; `{run.format(5, '0,1')}` (this report "
               "rewritten from the records by `hybrid-bench --suite baselines --out ")
    assert trained in text and text.count("--report-only") == 1
    assert bench_main([*argv, "--budget", "gpu-long"]) == 0  # the records' budget named: the same header
    assert trained in header(suite) and header(suite).count("--report-only") == 1


def test_a_run_recorded_twice_counts_once_its_later_record(tmp_path):
    """Two sessions' results.jsonl joined by hand may hold a run twice: the report counts it once, its later record
    winning, as the training path's report does (it counted as one more seed: "runs: 8" for 7)."""
    once = suite_dir(tmp_path / "once")
    bench_main(["--suite", "baselines", "--out", str(tmp_path / "once" / "out"), "--report-only"])
    twice = suite_dir(tmp_path / "twice")
    lines = (twice / "results.jsonl").read_text().splitlines()
    (twice / "results.jsonl").write_text("\n".join(lines + [lines[0]]) + "\n")
    bench_main(["--suite", "baselines", "--out", str(tmp_path / "twice" / "out"), "--report-only"])
    body = lambda suite: (suite / "report.md").read_text().split("- commands:")[1].split("\n", 1)[1]  # noqa: E731
    assert body(twice) == body(once) and f"- runs: {len(lines)} " in (twice / "report.md").read_text()


def test_what_a_person_wrote_above_the_report_is_kept_when_it_is_written_again(tmp_path):
    """docs/bench/gpu-long/report.md answers issue 42's questions above the generated report."""
    suite = suite_dir(tmp_path, report="- command: `x`")
    written = "# Answers\n\nBy hand, kept.\n\n"
    (suite / "report.md").write_text(written + (suite / "report.md").read_text())
    for _ in range(2):
        assert bench_main(["--suite", "baselines", "--out", str(tmp_path / "out"), "--report-only"]) == 0
        text = (suite / "report.md").read_text()
        assert text.startswith(written + "# hybrid-bench: baselines\n") and text.count("By hand") == 1


def test_a_dry_run_stays_a_dry_run_and_the_records_command_is_used(tmp_path):
    suite = suite_dir(tmp_path, name="smoke (dry run)", command=TRAINED_BY, report="- command: `other`")
    assert bench_main(["--suite", "baselines", "--out", str(tmp_path / "out"), "--report-only"]) == 0
    text = header(suite)
    assert "budget 'smoke (dry run)':" in text
    assert f"- command: `{TRAINED_BY}` (this report rewritten" in text and "`other`" not in text


@pytest.mark.parametrize("flags, message", [
    (["--budget", "cpu"], "--budget: expected the records' --budget smoke --dry-run ("),
    (["--budget", "smoke"], "got --budget smoke; --report-only reports the runs as they were trained: leave --budget"),
    (["--dry-run", "--budget", "smoke", "--steps", "7"], "--steps: expected the records' 300 ("),
])
def test_flags_naming_another_budget_are_refused_in_one_line(flags, message, tmp_path, capsys):
    suite = suite_dir(tmp_path, name="smoke (dry run)")
    assert bench_main(["--suite", "baselines", "--out", str(tmp_path / "out"), "--report-only", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybrid-bench: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (suite / "report.md").exists()


def test_recorded_budgets_join_the_seeds_and_models_of_continued_commands():
    def record(seeds, models, steps=12):
        return {"config": {"budget": {"name": "smoke", "models": models, "steps": steps, "seq_len": 32,
                                      "seeds": seeds}}}

    (one,) = recorded_budgets([record([0], ["a", "b"]), record([0, 1], ["c"])])
    assert one.seeds == (0, 1) and one.models == ("a", "b", "c")
    assert [b.steps for b in recorded_budgets([record([0], ["a"]), record([0], ["a"], steps=24)])] == [12, 24]


def test_the_command_line_round_trips_through_the_report(tmp_path):
    line = command_line(["hybrid-bench --suite a", "hybrid-bench --suite a --seeds 0,1"], "hybrid-bench --report-only")
    assert line.startswith("- commands: `hybrid-bench --suite a`; `hybrid-bench --suite a --seeds 0,1` (this")
    (tmp_path / "report.md").write_text(f"# x\n{line}\n")
    assert report_commands(tmp_path / "report.md") == ["hybrid-bench --suite a", "hybrid-bench --suite a --seeds 0,1"]
    (tmp_path / "report.md").write_text("# x\n- command: `hybrid-bench --suite a --report-only`\n")
    assert report_commands(tmp_path / "report.md") == [] == report_commands(tmp_path / "absent.md")



def test_a_training_command_says_when_the_folder_holds_runs_its_report_leaves_out(tmp_path):
    """The training path reports its own command's runs; the runs of an earlier command with other --models are
    named, with the way to report them all."""
    suite = suite_dir(tmp_path)  # seven gpu-long runs
    records = list(ResultsLog(suite).by_run().values())
    ours = [r for r in records if r["run"].startswith("hybrid/")]  # as if this command asked for --models hybrid
    note = runs_left_out(suite, ours)
    assert note.startswith("the report covers this command's 2 runs;") and "holds 5 more (" in note
    assert "transformer/seed1" in note and "hybrid/seed0" not in note and note.endswith("report them all")
    assert runs_left_out(suite, records) is None
