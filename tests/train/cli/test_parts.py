"""The parts every console script is built from (hybrid.train.cli.parts): one guard, one way to read
HYBRID_TRACEBACK, one parser, shared value types and flags."""
import argparse

import pytest

from hybrid.train.cli.flags import add_device_flag, add_log_flag
from hybrid.train.cli.parts import Parser, UsageError, add_set_flag, guarded, run_command, set_pair, show_tracebacks


def parser() -> Parser:
    p = Parser(prog="hybrid-x")
    p.add_argument("--log-every", type=int, default=1)
    add_log_flag(p)
    add_set_flag(p, help="fields")
    add_device_flag(p)
    return p


def test_run_command_gives_the_exit_status_of_each_outcome(capsys):
    assert run_command(parser(), ["--device", "cpu"], lambda args: 0) == 0
    assert run_command(parser(), ["--help"], lambda args: 0) == 0
    capsys.readouterr()

    def fails(error):
        def run(args):
            raise error
        return run

    for error, status, said in [
        (UsageError("--out: expected a directory, got the file x"), 2, "hybrid-x: error: --out: expected a directory"),
        (FileNotFoundError(2, "No such file or directory", "data/x"), 2, "hybrid-x: error: data/x: No such file"),
        (FloatingPointError("training diverged: …"), 1, "hybrid-x: training diverged: …"),
        (KeyboardInterrupt("at step 7; resume with: hybrid-x --resume r"), 130, "hybrid-x: interrupted at step 7;"),
        (KeyboardInterrupt("; the finished runs are kept"), 130, "hybrid-x: interrupted; the finished runs are kept"),
        (KeyboardInterrupt(), 130, "hybrid-x: interrupted"),
    ]:
        assert run_command(parser(), [], fails(error)) == status
        err = capsys.readouterr().err
        assert err.startswith(said) and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, message", [
    (["--log-e", "3"], "unrecognized arguments: --log-e 3"),  # never an abbreviation of --log-every
    (["--log", "mlflow"], "argument --log: invalid choice: 'mlflow'"),
    (["--device", "gpu"], "argument --device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    (["--set", "no_such_field=1"], "unknown HybridConfig field 'no_such_field'"),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, message, capsys):
    assert run_command(parser(), argv, lambda args: 0) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybrid-x: error: ") and message in err and err.count("\n") == 1, err


def test_shared_flags_parse_into_their_fields():
    args = parser().parse_args(["--log", "tensorboard", "--set", "d_model=64", "--device", "cuda:1"])
    assert args.log == ["tensorboard"] and args.sets == [("d_model", 64)] and args.device == "cuda:1"
    fresh = parser().parse_args([])
    assert fresh.log == [] and fresh.sets == [] and fresh.device == "auto"
    assert set_pair("pattern=RRA") == ("pattern", "RRA")  # a bare word stays a string
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        set_pair("d_model")


@pytest.mark.parametrize("value, shown", [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False),
                                          ("", False), ("no", False), (None, False)])
def test_hybrid_traceback_is_read_one_way(monkeypatch, value, shown):
    if value is None:
        monkeypatch.delenv("HYBRID_TRACEBACK", raising=False)
    else:
        monkeypatch.setenv("HYBRID_TRACEBACK", value)
    assert show_tracebacks() is shown

    def run():
        raise ValueError("bad value")

    if shown:
        with pytest.raises(ValueError, match="bad value"):  # the traceback goes through
            guarded("hybrid-x", run)
    else:
        assert guarded("hybrid-x", run) == 2


def test_every_cli_refuses_abbreviations():
    from importlib.metadata import entry_points

    from hybrid.train.cli.bench import bench_parser
    from hybrid.train.cli.lm import generate_parser, train_parser
    from hybrid.train.cli.distill import parser as distill_parser
    from hybrid.train.cli.hf import eval_parser, export_parser, import_parser
    from hybrid.train.cli.rope_analyze import analyze_parser
    from hybrid.train.cli.synthetic import parser as synthetic_parser

    parsers = [train_parser, generate_parser, bench_parser, eval_parser, export_parser, import_parser,
               analyze_parser, synthetic_parser, distill_parser]
    assert all(p().allow_abbrev is False for p in parsers)
    scripts = {e.name for e in entry_points(group="console_scripts") if e.value.startswith("hybrid.")}
    assert len(scripts) == len(parsers), scripts  # a new CLI gets a line here
