"""The shared suite machinery (budgets, records, resume, reports) and the synthetic suite's smoke budget, end to end."""
from __future__ import annotations

import json
import shutil

import pytest

from hybrid.train.checkpoint import load_checkpoint
from hybrid.train.suite import (
    Budget,
    ResultsLog,
    RunSpec,
    fmt_mean_std,
    is_tie,
    markdown_table,
    mean_std,
    parse_int_list,
    plot_lines,
    run_suite,
)
from hybrid.train.tasks import cli
from hybrid.train.tasks.suite import BUDGETS, MODELS, build_specs, budget_for

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------ budgets


def test_budget_override_and_describe():
    b = Budget(name="x", models=("a", "b"), steps=10, seq_len=32, seeds=(0, 1, 2), lrs=(1e-3, 3e-3))
    o = b.override(steps=5, seq_len=16, seeds=(4,), models=("b",), known_models=("a", "b"))
    assert (o.steps, o.seq_len, o.seeds, o.models) == (5, 16, (4,), ("b",))
    assert b.override() == b
    text = o.describe()
    assert text.startswith("budget 'x':") and "steps       5" in text and "seeds       4" in text
    with pytest.raises(ValueError, match=r"models: expected names from \['a', 'b'\], got \['c'\]"):
        b.override(models=("c",), known_models=("a", "b"))
    with pytest.raises(ValueError, match=r"steps: expected a positive int, got 0"):
        b.override(steps=0)


def test_parse_seeds():
    assert parse_int_list("0,1, 2") == (0, 1, 2)
    with pytest.raises(ValueError, match=r"--seeds: expected comma-separated integers"):
        parse_int_list("a,b")


def test_budget_steps_override_reaches_every_task():
    b = budget_for("cpu", steps=7)
    assert {s.steps for s in build_specs("all", b)} == {7}
    assert {s.steps for s in build_specs("mqar", BUDGETS["cpu"])} == {BUDGETS["cpu"].extra["mqar_steps"]}


def test_mqar_recipe_reaches_every_run():
    """MQAR's own steps, curriculum and untied output layer reach each of its runs; state tracking keeps its own."""
    cpu = BUDGETS["cpu"]
    mqar = build_specs("mqar", cpu)
    assert {s.config["lr"] for s in mqar} == set(cpu.lrs)
    assert {s.config["curriculum_steps"] for s in mqar} == {125} and {s.steps for s in mqar} == {500}
    assert all(s.config["model"]["tie_embeddings"] is False for s in mqar)
    state = build_specs("state-tracking", cpu)
    assert {s.config["curriculum_steps"] for s in state} == {0}
    assert all("tie_embeddings" not in s.config["model"] for s in state)
    assert {s.config["curriculum_steps"] for s in build_specs("mqar", budget_for("cpu", steps=40))} == {10}


def test_specs_cover_models_rates_and_seeds():
    b = BUDGETS["cpu"].override(seeds=(0, 1))
    specs = build_specs("state-tracking", b)
    assert len(specs) == 3 * len(MODELS) * len(b.lrs) * 2
    assert len({s.run for s in specs}) == len(specs)


# ------------------------------------------------------------------------------------------------ records


def test_results_log_skips_a_torn_line(tmp_path):
    log = ResultsLog(tmp_path)
    log.append({"run": "a", "metrics": {"x": 1}})
    with open(log.path, "a") as f:
        f.write('{"run": "b", "metr')  # a crash while appending
    assert [r["run"] for r in log.records()] == ["a"]


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


# ------------------------------------------------------------------------------------------------ report


def test_report_pieces(tmp_path):
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5))
    assert fmt_mean_std([0.5]) == "0.500" and fmt_mean_std([]) == "–"
    assert fmt_mean_std([1.0, 3.0], digits=1) == "2.0 ± 1.4"
    assert is_tie([1.0, 3.0], [2.5]) and not is_tie([1.0, 1.0], [2.0])
    assert markdown_table(["a", "b"], [[1, "x|y"]]) == "| a | b |\n|---|---|\n| 1 | x\\|y |"
    path = plot_lines(tmp_path / "p.png", {"m": ([1, 2], [0.5, 0.7], [0.0, 0.1])}, xlabel="x", ylabel="y",
                      logx=True, hline=0.5)
    assert path.read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------------------------------------ end to end


def test_smoke_budget_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "synth"
    assert cli.main(["--suite", "all", "--budget", "smoke", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "budget 'smoke':" in printed and "report:" in printed
    log = ResultsLog(out)
    records = log.records()
    n_tasks = 4  # parity, mod5, mod5-brackets, mqar at one width
    assert len(records) == n_tasks * len(MODELS)
    for r in records:
        run_dir = out / r["run"]
        assert load_checkpoint(run_dir).step == BUDGETS["smoke"].steps
        assert json.loads((run_dir / "task.json").read_text())["tokens"]
        assert json.loads((run_dir / "results.json").read_text())["accuracy"] == r["metrics"]["accuracy"]
    report = (out / "report.md").read_text()
    for name in ("parity", "mod5", "mod5-brackets", "mqar-d16"):
        assert f"## {name}" in report and (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    assert "best validation accuracy" in report and "vo-rnn-data" in report

    # delete one finished run halfway (its record and part of its directory): only it runs again
    lines = log.path.read_text().splitlines()
    gone = json.loads(lines[3])["run"]
    log.path.write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    shutil.rmtree(out / gone / "checkpoint")
    assert cli.main(["--suite", "all", "--budget", "smoke", "--out", str(out), "--quiet"]) == 0
    after = log.by_run()
    assert len(after) == len(records)
    assert all(after[r["run"]]["finished_at"] == r["finished_at"] for r in records if r["run"] != gone)
    assert load_checkpoint(out / gone).step == BUDGETS["smoke"].steps


def test_one_task_run_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "parity-data"
    code = cli.main(["--task", "parity", "--budget", "smoke", "--preset", "vo-rnn", "--set", 'rnn_phase="data"',
                     "--out", str(out), "--quiet"])
    assert code == 0
    assert "accuracy" in capsys.readouterr().out
    assert load_checkpoint(out).config["rnn_phase"] == "data"
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
    with pytest.raises(SystemExit) as e:
        cli.main(argv + (["--out", str(tmp_path / "x")] if "--out" not in argv else []) + ["--budget", "smoke"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_report_picks_the_best_rate_and_states_the_target(tmp_path):
    from hybrid.train.tasks.suite import write_suite_report

    def record(model, lr, valid, acc256):
        return {"run": f"parity/{model}/{lr}", "model": model, "seed": 0, "seconds": 1.0,
                "config": {"task_label": "parity", "lr": lr},
                "metrics": {"status": "finished", "final_loss": 0.1, "valid_accuracy": valid, "valid_loss": 1 - valid,
                            "chance": 0.5, "score": "last", "accuracy": {"40": valid, "256": acc256},
                            "scaled_accuracy": {"40": 2 * valid - 1, "256": 2 * acc256 - 1}}}

    records = [record("vo-rnn-data", 1e-3, 0.8, 0.99), record("vo-rnn-data", 3e-3, 1.0, 0.9), record("vo-rnn", 1e-3, 0.6, 0.5)]
    text = write_suite_report(tmp_path, "state-tracking", BUDGETS["cpu"], records).read_text()
    assert "| vo-rnn-data | 0.003 | 1.000 | 1.000 | 0.900 | 0.800 |" in text  # the rate with the best validation
    assert "- Target: vo-rnn-data ≥ 0.99 accuracy at length 256: 0.900, missed by 0.090." in text
    assert "vo-rnn-data-selective ≥" not in text  # no runs, no line
    assert (tmp_path / "parity.png").read_bytes()[:8] == PNG_MAGIC


def test_report_shows_every_rate_that_ties_on_validation(tmp_path):
    """Two rates at validation accuracy 1.0 and loss 0.0 (float32 underflow) cannot be told apart: both rows and
    both target lines are shown, never one picked by the order of the grid."""
    from hybrid.train.tasks.suite import write_suite_report

    def record(lr, acc256):
        return {"run": f"parity/vo-rnn-data-selective/{lr}", "model": "vo-rnn-data-selective", "seed": 0,
                "seconds": 1.0, "config": {"task_label": "parity", "lr": lr},
                "metrics": {"status": "finished", "final_loss": 0.0, "valid_accuracy": 1.0, "valid_loss": 0.0,
                            "chance": 0.5, "score": "last", "accuracy": {"40": 1.0, "256": acc256},
                            "scaled_accuracy": {"40": 1.0, "256": 2 * acc256 - 1}}}

    text = write_suite_report(tmp_path, "state-tracking", BUDGETS["cpu"], [record(1e-3, 0.684), record(3e-3, 1.0)]).read_text()
    assert "| vo-rnn-data-selective | 0.001 (tie) | 1.000 | 1.000 | 0.684 | 0.368 |" in text
    assert "| vo-rnn-data-selective | 0.003 (tie) | 1.000 | 1.000 | 1.000 | 1.000 |" in text
    assert ("Target: vo-rnn-data-selective ≥ 0.99 accuracy at length 256 at lr 0.001 (tied on validation with "
            "another rate): 0.684, missed by 0.306.") in text
    assert "at lr 0.003 (tied on validation with another rate): 1.000, met." in text
