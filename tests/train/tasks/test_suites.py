"""The synthetic suite (hybrid.train.tasks.suites): budgets and specs per task, the smoke budget end to end with
resume, and the report's choice of learning rate."""
from __future__ import annotations

import json
import shutil

import pytest

from hybrid.train.cli import synthetic as cli
from hybrid.train.loop.checkpoint import load_checkpoint
from hybrid.train.suite import ResultsLog
from hybrid.train.tasks.suites import BUDGETS, MODELS, build_specs, budget_for

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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


def test_report_picks_the_best_rate_and_states_the_target(tmp_path):
    from hybrid.train.tasks.suites import write_suite_report

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
    from hybrid.train.tasks.suites import write_suite_report

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


def _parity_record(model, lr, seed, long_acc, acc256, *, valid=1.0, loss=0.0, long_loss=0.1):
    return {"run": f"parity/{model}/{lr}/seed{seed}", "model": model, "seed": seed, "seconds": 1.0,
            "config": {"task_label": "parity", "lr": lr},
            "metrics": {"status": "finished", "final_loss": 0.0, "valid_accuracy": valid, "valid_loss": loss,
                        "valid_length": 80, "valid_long_accuracy": long_acc, "valid_long_loss": long_loss,
                        "chance": 0.5, "score": "last", "accuracy": {"40": 1.0, "256": acc256},
                        "scaled_accuracy": {"40": 1.0, "256": 2 * acc256 - 1}}}


def test_the_long_validation_picks_the_rate_where_the_training_lengths_tie(tmp_path):
    """Both rates fit the training lengths exactly (accuracy 1.0, loss 0.0): the mean accuracy at twice the
    longest training length decides, in either order of the grid; the per-seed table marks the kept rate."""
    from hybrid.train.tasks.selection import summarise
    from hybrid.train.tasks.suites import write_suite_report

    m = "vo-rnn-data-selective"
    records = [_parity_record(m, 1e-3, s, long, acc) for s, long, acc in [(0, 1.0, 0.68), (1, 0.6, 0.09)]]
    records += [_parity_record(m, 3e-3, s, long, acc) for s, long, acc in [(0, 1.0, 1.0), (1, 0.9, 0.99)]]
    for order in (records, records[::-1]):
        (choice,) = summarise(order)["parity"][m]
        assert (choice["lr"], choice["tied"]) == (3e-3, False)
    # the long-validation loss breaks a tie in accuracy; the training lengths come before it
    closer = [_parity_record(m, 1e-3, 0, 1.0, 0.5, long_loss=0.2), _parity_record(m, 3e-3, 0, 1.0, 0.5, long_loss=0.3)]
    assert [c["lr"] for c in summarise(closer)["parity"][m]] == [1e-3]
    worse_fit = [_parity_record(m, 1e-3, 0, 1.0, 0.5, valid=0.99), _parity_record(m, 3e-3, 0, 1.0, 0.5, long_loss=0.9)]
    assert [c["lr"] for c in summarise(worse_fit)["parity"][m]] == [3e-3]
    text = write_suite_report(tmp_path, "parity-recipe", BUDGETS["cpu"], records).read_text()
    assert f"| {m} | 0.003 | 1.000 ± 0.000 | 0.950 ± 0.071 | 1.000 ± 0.000 | 0.995 ± 0.007 |" in text
    assert f"| {m} | 0.001 | 0.680 | 0.090 | 0 / 2 |" in text
    assert f"| {m} | 0.003 (kept) | 1.000 | 0.990 | 2 / 2 |" in text


def test_the_parity_recipe_suite_runs_every_candidate_with_its_options_over_five_seeds():
    from hybrid.train.tasks.suites import CANDIDATES

    specs = build_specs("parity-recipe", budget_for("cpu", suite="parity-recipe"))
    assert len(specs) == (1 + len(CANDIDATES)) * 2 * 5
    by_model = {s.model: s.config for s in specs}
    assert by_model["recipe+round-late"]["phase_round_from"] == 0.5
    assert by_model["recipe+round-late"]["model"]["recurrence.phase_round"] == 2
    assert by_model["recipe+grow-80"]["grow_lengths_to"] == 80
    assert by_model["vo-rnn-data-selective"]["grow_lengths_to"] == 0
    assert {s.config["task"] for s in specs} == {"parity"}


def test_the_recipe_is_a_suite_model_with_its_rounding_and_its_studied_rate():
    from hybrid.train.tasks.suites import default_lr, model_entry

    preset, overrides, options = model_entry("vo-rnn-recipe")
    specs = [s for s in build_specs("state-tracking", BUDGETS["cpu"]) if s.model == "vo-rnn-recipe"]
    assert len(specs) == 3 * len(BUDGETS["cpu"].lrs)
    for s in specs:
        model = s.config["model"]
        assert (model["recurrence.phase_round"], model["recurrence.phase_round_at_inference"]) == (4, True)
        assert (model["rnn_selective_gate"], s.config["phase_round_from"]) == ("hardsigmoid", 0.5)
        assert model["recurrence.hold_below"] == 0.25
    assert default_lr(BUDGETS["cpu"], "parity", preset, overrides, options) == (
        3e-3, "vo-rnn-recipe's best rate on parity at the cpu budget, chosen by validation")
    assert default_lr(BUDGETS["cpu"], "mod5", preset, overrides, options) == (3e-3, "the largest of the cpu budget's grid")


def test_the_studys_candidates_are_named_from_its_own_suite_only():
    """``hybrid-synthetic --model`` offers the models; the parity study's candidates stay reproducible by name from
    the study's suite (``--suite parity-recipe --models CANDIDATE``), and only there."""
    from hybrid.train.cli.synthetic import parser
    from hybrid.train.tasks.suites import CANDIDATES, G_MODELS, MODELS, budget_for

    model_flag = next(a for a in parser()._actions if "--model" in a.option_strings)
    assert list(model_flag.choices) == [*MODELS, *G_MODELS]  # the G mixer's models are models (issue 46)
    assert not (set(CANDIDATES) - set(MODELS)) & set(model_flag.choices)
    assert tuple(budget_for("smoke", models=["recipe+round"], suite="parity-recipe").models) == ("recipe+round",)
    with pytest.raises(ValueError, match="models: expected names from"):
        budget_for("smoke", models=["recipe+round"], suite="state-tracking")


def test_the_report_gives_the_most_common_answers_accuracy_as_a_range_or_one_value():
    from hybrid.train.tasks.suites import _floor_text

    assert _floor_text({"40": 0.219, "256": 0.25}) == "; the most common answer alone scores 0.219–0.25 at the test points"
    assert _floor_text({"10": 0.375, "20": 0.375}) == "; the most common answer alone scores 0.375 at the test points"
    assert _floor_text(None) == ""  # records made before it was kept
