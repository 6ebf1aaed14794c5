"""hybrid-synthetic (hybrid.train.tasks.cli): one task run from the command line, one-line errors."""
from __future__ import annotations

import json

import pytest

from hybrid.train.checkpoint import load_checkpoint
from hybrid.train.tasks import cli


def test_one_task_run_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "parity-data"
    code = cli.main(["--task", "parity", "--budget", "smoke", "--preset", "vo-rnn", "--set", 'rnn_phase="data"',
                     "--out", str(out), "--quiet"])
    assert code == 0
    assert "accuracy" in capsys.readouterr().out
    assert load_checkpoint(out).config["recurrence"]["phase"] == "data"
    assert set(json.loads((out / "results.json").read_text())["accuracy"]) == {"10", "20"}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--suite", "all", "--models", "gpt"], "models: expected names from"),
        (["--suite", "all", "--seeds", "x"], "--seeds: expected comma-separated integers"),
        (["--suite", "all", "--set", "rnn_phase=\"data\""], "--set, --lr and --batch-size: apply to one run"),
        (["--task", "sorting"], "argument --task: invalid choice"),
        (["--task", "parity", "--set", "rnn_phase=\"spin\""], "rnn_phase: expected one of"),
        (["--task", "parity", "--steps", "0"], "argument --steps: expected a positive integer"),
    ],
)
def test_command_line_errors_are_one_line(tmp_path, capsys, argv, message):
    assert cli.main(argv + (["--out", str(tmp_path / "x")] if "--out" not in argv else []) + ["--budget", "smoke"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
