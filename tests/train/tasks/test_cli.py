"""hybrid-synthetic (hybrid.train.cli.synthetic): one task run from the command line, one-line errors."""
from __future__ import annotations

import json

import pytest

from hybrid.train.loop.checkpoint import load_checkpoint
from hybrid.train.cli import synthetic as cli


def test_one_task_run_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "parity-data"
    code = cli.main(["--task", "parity", "--budget", "smoke", "--preset", "vo-rnn", "--set", 'rnn_phase="data"',
                     "--out", str(out), "--quiet"])
    assert code == 0
    assert "accuracy" in capsys.readouterr().out
    assert load_checkpoint(out).config["recurrence"]["phase"] == "data"
    assert set(json.loads((out / "results.json").read_text())["accuracy"]) == {"10", "20"}


def test_a_passkey_run_takes_a_staged_curriculum_from_the_command_line(tmp_path):
    out = tmp_path / "pk"
    assert cli.main(["--task", "passkey", "--budget", "smoke", "--preset", "hybrid", "--curriculum", "16,24",
                     "--curriculum-steps", "4", "--steps", "5", "--out", str(out), "--quiet"]) == 0
    run = load_checkpoint(out).extra["task_run"]
    assert run["curriculum_steps"] == 4 and run["task_params"]["curriculum_length"] == [16, 24]
    assert json.loads((out / "task.json").read_text())["params"]["curriculum_length"] == [16, 24]


def test_a_single_run_of_a_studied_model_uses_its_best_rate_and_says_so(tmp_path, capsys, monkeypatch):
    """The rate comes from BEST_LRS when the run is exactly the studied model (named by --model, or spelled with
    --preset and --set); any other configuration gets the largest rate of the grid; --lr wins. Each says which."""
    from hybrid.train.tasks import suites as suite

    monkeypatch.setitem(suite.BEST_LRS, ("smoke", "parity"), {"vo-rnn-data-selective": 1e-3})
    spelled = ["--preset", "vo-rnn", "--set", 'rnn_phase="data"', "--set", "recurrence.selective=true",
               "--set", 'rnn_selective_gate="hardsigmoid"']
    cases = [(["--model", "vo-rnn-data-selective"], 1e-3, "vo-rnn-data-selective's best rate on parity at the smoke"),
             (spelled, 1e-3, "vo-rnn-data-selective's best rate"),
             (spelled + ["--set", "rnn_r_max=0.99"], 3e-3, "the largest of the smoke budget's grid"),
             (["--model", "vo-rnn-recipe"], 3e-3, "the largest of the smoke budget's grid"),
             (["--model", "vo-rnn-data-selective", "--lr", "0.02"], 0.02, "--lr")]
    for i, (argv, lr, why) in enumerate(cases):
        out = tmp_path / f"run{i}"
        assert cli.main(["--task", "parity", "--budget", "smoke", *argv, "--out", str(out), "--quiet"]) == 0
        assert f"learning rate {lr:g}: {why}" in capsys.readouterr().out
        run = load_checkpoint(out).extra["task_run"]
        assert run["lr"] == lr
    assert run["model"]["rnn_selective_gate"] == "hardsigmoid"
    assert load_checkpoint(tmp_path / "run3").extra["task_run"]["phase_round_from"] == 0.5  # the recipe's option


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--suite", "all", "--models", "gpt"], "models: expected names from"),
        (["--suite", "all", "--seeds", "x"], "--seeds: expected comma-separated integers"),
        (["--suite", "all", "--set", "rnn_phase=\"data\""], "--set, --lr, --batch-size, --model, --preset,"),
        (["--suite", "parity-recipe", "--model", "vo-rnn"], "--edge-share and --init-from: apply to one run (--task)"),
        (["--task", "parity", "--model", "recipe+round"], "argument --model: invalid choice: 'recipe+round'"),
        (["--suite", "state-tracking", "--models", "recipe+round"], "models: expected names from"),
        (["--suite", "passkey", "--curriculum", "8"], "--edge-share and --init-from: apply to one run (--task)"),
        (["--task", "parity", "--curriculum", "8"], "--curriculum: expected a passkey task (a length curriculum), "
                                                    "got --task parity"),
        (["--task", "passkey", "--curriculum", "16,33"],
         "--curriculum: expected an int in [12, train_length=32] or a list of increasing ones, got 33"),
        (["--task", "passkey", "--curriculum", "16,x"], "--curriculum: expected comma-separated integers such as 64,256, "
                                                       "got '16,x'"),
        (["--task", "passkey", "--edge-share", "1.5"], "--edge-share: expected a share in [0, 1], got 1.5"),
        (["--task", "mqar", "--edge-share", "0.2"], "--edge-share: expected a passkey task (keys at the edges), "
                                                   "got --task mqar"),
        (["--task", "passkey", "--curriculum-steps", "4"], "--curriculum-steps: expected at most the run's 3 steps, "
                                                          "got 4"),
        (["--task", "parity", "--model", "vo-rnn-recipe", "--preset", "vo-rnn"],
         "--model: names a preset and its options; expected no --preset with it, got --preset vo-rnn"),
        (["--task", "passkey", "--model", "vo-rnn"], "--model: expected a state-tracking or MQAR task, got --task passkey"),
        (["--task", "parity", "--model", "gpt"], "argument --model: invalid choice: 'gpt'"),
        (["--task", "sorting"], "argument --task: invalid choice"),
        (["--task", "parity", "--set", "rnn_phase=\"spin\""], "rnn_phase: expected one of"),
        (["--task", "parity", "--steps", "0"], "argument --steps: expected a positive integer"),
        (["--task", "mqar", "--seq-len", "7"], "--seq-len: expected no --seq-len with --task mqar"),
        (["--suite", "mqar", "--seq-len", "7"], "--seq-len: expected no --seq-len with --suite mqar"),
        (["--task", "parity", "--seeds", "-1"], "--seeds (seed): expected an int >= 0, got -1"),
        (["--task", "parity", "--lr", "-1"], "--lr: expected a finite number > 0, got -1.0"),
        (["--task", "mod5", "--seq-len", "1"], "--seq-len (train_lengths): expected 2 <= low <= high, got (1, 1)"),
        (["--task", "passkey", "--seq-len", "5"], "--seq-len (train_length): expected an int >= 12"),
    ],
)
def test_command_line_errors_are_one_line(tmp_path, capsys, argv, message):
    assert cli.main(argv + (["--out", str(tmp_path / "x")] if "--out" not in argv else []) + ["--budget", "smoke"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
