"""Progress in a log file: plain lines, one per tenth, never tqdm's carriage returns (hybrid.train.output.progress);
the suites' bar (hybrid.train.suite.runner) goes through it."""
import io

from hybrid.train.output.progress import PlainProgress, progress_bar
from hybrid.train.suite import RunSpec
from hybrid.train.suite.runner import run_suite


def test_plain_progress_writes_a_line_per_tenth():
    out = io.StringIO()
    bar = PlainProgress(total=20, desc="suite", unit="step", file=out)
    for i in range(20):
        bar.set_postfix_str(f"run{i // 10}")
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in out.getvalue()
    assert lines[0].startswith("suite: 2/20 steps (10%), 0m") and lines[0].endswith(", run0")
    assert lines[-1].startswith("suite: 20/20 steps (100%)")
    quiet = PlainProgress(total=5, disable=True, file=out)
    quiet.update(5)
    quiet.close()
    assert len(out.getvalue().splitlines()) == 10


def test_a_suite_logs_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    assert isinstance(progress_bar(total=1), PlainProgress)  # pytest's captured stderr is not a terminal

    def execute(spec, run_dir, advance):
        run_dir.mkdir(parents=True)
        for _ in range(spec.steps):
            advance(1)
        return {"ok": True}

    specs = [RunSpec(run=f"m{i}/seed0", model=f"m{i}", seed=0, steps=5) for i in range(2)]
    run_suite(tmp_path / "suite", specs, execute, suite="demo")
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[-1].startswith("demo: 10/10 steps (100%)"), err
