"""Rules every console script keeps, checked over all of them (issue 47): each --help line shows its default, each
takes --threads, and the remaining silent behaviours and unclear messages: hybrid-eval's options checked before
lm-eval starts, hybrid-train --init-from with --preset/--size, --valid-fraction's one range, hybrid-bench's Ctrl-C,
hybrid-synthetic --task with several seeds, the run it prints and its scores."""
import argparse

import pytest
import torch

from hybrid.train.cli.bench import bench_parser
from hybrid.train.cli.lm import generate_parser, train_parser
from hybrid.train.cli.distill import parser as distill_parser
from hybrid.train.cli.rope_analyze import analyze_parser
from hybrid.train.cli.synthetic import parser as synthetic_parser

from hybrid.train.cli import hf as hf_cli

PARSERS = [train_parser, generate_parser, synthetic_parser, hf_cli.export_parser, hf_cli.import_parser,
           hf_cli.eval_parser, analyze_parser, bench_parser, distill_parser]


def options(parser: argparse.ArgumentParser):
    """The optional arguments a user may leave out (not --help; not one of a required either-or group)."""
    either = {id(a) for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    for action in parser._actions:
        if action.option_strings and not action.required and id(action) not in either \
                and not isinstance(action, argparse._HelpAction):
            yield action


@pytest.mark.parametrize("make", PARSERS, ids=lambda m: m().prog)
def test_every_help_line_shows_its_default(make):
    parser = make()
    missing = [a.option_strings[-1] for a in options(parser) if "(default" not in (a.help or "")]
    assert not missing, f"{parser.prog}: --help lines without a default: {missing}"


@pytest.mark.parametrize("make", PARSERS, ids=lambda m: m().prog)
def test_every_command_takes_threads_and_device_defaults_to_auto(make):
    parser = make()
    flags = {a.option_strings[-1]: a for a in parser._actions if a.option_strings}
    assert "--threads" in flags, parser.prog
    if "--device" in flags:
        default = flags["--device"].default
        assert default in ("auto", argparse.SUPPRESS), (parser.prog, default)  # SUPPRESS: the config's, "auto"
        assert "(default: auto)" in flags["--device"].help


def test_threads_apply_for_the_command_only(monkeypatch):
    from hybrid.train.cli.flags import add_threads_flag
    from hybrid.train.cli.parts import Parser, run_command

    seen = []
    before = torch.get_num_threads()
    parser = Parser(prog="x")
    add_threads_flag(parser)
    assert run_command(parser, ["--threads", "1"], lambda args: seen.append(torch.get_num_threads()) or 0) == 0
    assert seen == [1] and torch.get_num_threads() == before
    assert run_command(parser, ["--threads", "0"], lambda args: 0) == 2  # read as a positive integer


# ------------------------------------------------------------------------------------------------- hybrid-eval


@pytest.mark.parametrize("argv, needles", [
    (["--max-length", "1"], ["--max-length: expected an integer >= 2, got '1'"]),
    (["--num-fewshot", "-1"], ["--num-fewshot: expected an integer >= 0, got '-1'"]),
    (["--log-samples"], ["--log-samples: expected together with --output", "got no --output"]),
    (["--device", "cuda"], ["device: 'cuda' was asked for, but this torch build sees no CUDA device"]),
])
def test_eval_checks_its_options_before_lm_eval_starts(argv, needles, tmp_path, capsys, monkeypatch, one_line_error):
    if argv[0] == "--device" and torch.cuda.is_available():
        pytest.skip("the machine has CUDA")
    import hybrid.train.hf.evaluate as ev

    def never(*args, **kwargs):
        raise AssertionError("lm-eval started before the options were checked")

    monkeypatch.setattr(ev, "import_lm_eval", never)
    monkeypatch.setattr(ev, "load_for_eval", never)
    assert hf_cli.eval_main([str(tmp_path), "--tasks", "t", *argv]) == 2
    one_line_error(capsys, "hybrid-eval", *needles)


def test_eval_library_checks_the_same(tmp_path):
    from hybrid.train.hf.evaluate import check_eval_options

    assert check_eval_options("auto", None, None) in ("cpu", "cuda:0")
    for kwargs, message in [(dict(max_length=1), "max_length: expected an integer >= 2"),
                            (dict(num_fewshot=-1), "num_fewshot: expected an integer >= 0"),
                            (dict(device="gpu"), "device: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")]:
        with pytest.raises(ValueError, match=message):
            check_eval_options(**{"device": "cpu", "max_length": None, "num_fewshot": None, **kwargs})


def test_eval_refuses_a_max_length_shorter_than_a_continuation(tmp_path):
    """A --max-length that passes the floor but not a task's requests: one line, never lm-eval's AssertionError."""
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]' in the hybrid checkout); "
                                          "it is not in the test extra: it pulls scikit-learn and friends")
    from hybrid.train.hf.evaluate import checked_lm

    class Base:
        max_length, max_gen_toks = 4, 256

        def _loglikelihood_tokens(self, requests, *args, **kwargs):
            return ["scored"]

        def generate_until(self, requests, *args, **kwargs):
            return ["text"]

    class Request:
        args = ("prompt", {"max_gen_toks": 8})

    lm = checked_lm(Base)()
    assert lm._loglikelihood_tokens([(("a", "b"), [1], [2, 3])]) == ["scored"]
    with pytest.raises(ValueError, match=r"^max_length: expected at least the 5 tokens of the tasks' longest "
                                         r"continuation, got 4 \(--max-length\)$"):
        lm._loglikelihood_tokens([(("a", "b"), [1], [2, 3]), (("a", "b"), [1], [1, 2, 3, 4, 5])])
    with pytest.raises(ValueError, match=r"^max_length: expected more than the 8 tokens the task generates, got 4"):
        lm.generate_until([Request()])


# ----------------------------------------------------------------------------------------------- hybrid-train


def test_init_from_refuses_preset_and_size_and_the_banner_names_the_source(tmp_path, capsys, one_line_error):
    from hybrid.train.cli.lm import train_main
    from hybrid.train.lm.config import TrainConfig
    from hybrid.train.output.console import start_message
    from hybrid.models import HybridConfig

    for flag, value in (("--preset", "retnet"), ("--size", "small")):
        assert train_main(["--init-from", str(tmp_path), flag, value, "--out", str(tmp_path / "o")]) == 2
        one_line_error(capsys, "hybrid-train", f"{flag}: the architecture comes from --init-from; expected no {flag} "
                                               f"with it, got {flag} {value}")
    config = TrainConfig(init_from="runs/tf", out="runs/x")
    stats = {"source": "s", "train_tokens": 1, "valid_tokens": 1, "tokenizer": "bytes"}
    line = start_message(resumed=False, config=config, model_config=HybridConfig.preset("transformer"),
                         num_parameters=10, device="cpu", wrap="single process", stats=stats, start=0,
                         global_batch=16, world_size=1).splitlines()[0]
    assert line.startswith("training from runs/tf (pattern A,") and "hybrid/tiny" not in line


@pytest.mark.parametrize("value", ["1", "1.5", "0", "-0.5", "nan"])
def test_valid_fraction_has_one_range(value, capsys, tmp_path, one_line_error):
    from hybrid.train.cli.lm import train_main
    from hybrid.train.cli.distill import main as distill_main

    assert train_main(["--valid-fraction", value, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "hybrid-train", "valid_fraction: expected a number in (0, 1), got")
    assert distill_main(["--teacher", "t", "--pattern", "R", "--valid-fraction", value]) == 2
    one_line_error(capsys, "hybrid-distill", "valid_fraction: expected a number in (0, 1), got")


# ----------------------------------------------------------------------------------------------- hybrid-bench


def test_bench_ctrl_c_prints_the_command_that_continues(tmp_path, capsys, monkeypatch):
    from hybrid.train.bench import harness
    from hybrid.train.cli import bench as bench_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "run_bench", interrupted)
    out = tmp_path / "bench"
    assert bench_cli.bench_main(["--suite", "baselines", "--out", str(out), "--overwrite", "--quiet"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == (f"hybrid-bench: interrupted; the finished runs are kept in {out}; continue with: hybrid-bench "
                   f"--suite baselines --out {out} --quiet")
    assert not (out / "baselines" / ".hybrid.lock").exists()  # the lock went with the interrupted suite


# ------------------------------------------------------------------------------------------- hybrid-synthetic


def test_synthetic_task_refuses_several_seeds(tmp_path, capsys, one_line_error):
    from hybrid.train.cli.synthetic import main

    assert main(["--task", "parity", "--budget", "smoke", "--seeds", "0,1", "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "hybrid-synthetic", "--seeds: expected one seed with --task", "got 0,1")
    assert not (tmp_path / "o").exists()


def test_synthetic_task_refuses_models(tmp_path, capsys, one_line_error):
    """The issue: `--task parity --models hybrid` trained the default model, --models silently ignored."""
    from hybrid.train.cli.synthetic import main

    assert main(["--task", "parity", "--budget", "smoke", "--models", "hybrid", "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "hybrid-synthetic", "--models: expected no --models with --task", "--model or --preset",
                   "got --models hybrid")
    assert not (tmp_path / "o").exists()


def test_synthetic_task_prints_the_run_it_makes_before_training(tmp_path, capsys, monkeypatch):
    from hybrid.train.cli import synthetic as cli

    printed = []

    def train_task(config, run_dir, on_step=None):
        printed.append(capsys.readouterr().out)  # what was printed before training started
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "train_task", train_task)
    assert cli.main(["--task", "parity", "--budget", "smoke", "--batch-size", "2", "--seeds", "5", "--steps", "7",
                     "--set", "d_model=24", "--out", str(tmp_path / "o"), "--quiet"]) == 130
    block = printed[0]
    assert block.startswith("run: --task parity (defaults from the 'smoke' budget, then the flags given)")
    for line in ("  batch_size  2", "  seed        5", "  steps       7 (0 on the curriculum)",
                 "  model       vo-rnn (pattern R, d_model 24, 1 layer, 2 heads)"):
        assert line in block.splitlines(), block
    assert "budget 'smoke'" not in block  # the budget's own block (batch 4, its seeds) is not shown as the run's


def test_synthetic_scores_never_show_minus_zero():
    from hybrid.train.cli.synthetic import run_block, score_text
    from hybrid.train.tasks.train import TaskRunConfig
    from hybrid.models import HybridConfig

    assert [score_text(v) for v in (-0.00001, -0.0, 0.0, 0.123449, -0.5)] == ["0.0000", "0.0000", "0.0000", "0.1234",
                                                                          "-0.5000"]
    config = TaskRunConfig(task="passkey-text", init_from="runs/demo", batch_size=16, seed=0, steps=1500,
                           curriculum_steps=0, size=None)
    from hybrid.train.tasks.suites import budget_for

    block = run_block(config, HybridConfig.preset("hybrid", "tiny"), budget_for("cpu", suite="passkey-text"),
                       1e-3, "--lr")
    assert "  model       from runs/demo (pattern RRA" in block and "  batch_size  16" in block
