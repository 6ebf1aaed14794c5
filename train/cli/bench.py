"""``hybrid-bench`` (= ``python -m hybrid.train.cli.bench``): train the suites on equal budgets and report.

User errors print one line and exit 2 (``hybrid.train.cli.lm``'s conventions); an interrupted suite exits 130 and
the next invocation continues it, as does one that ``--max-minutes`` stopped between runs (it exits 0 and says so).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..bench.budgets import BUDGETS, bench_budget, check_window, dry_run, recorded_budgets, with_window
from ..bench.suites import SUITES
from ..lm.config import TrainConfig
from ..options.sections import DataOptions, LoopOptions
from ..output.outdir import prepare_suite_dir
from ..output.paths import check_apart, data_input
from ..output.run_lock import lock_run_dir
from ..suite import ResultsLog, TimeLimit, parse_int_list, parse_name_list
from .flags import add_device_flag, add_log_flag, add_option_flags, add_threads_flag
from .parts import Parser, add_set_flag, finite_float, positive_int, run_command

__all__ = ["bench_main", "bench_parser"]

EPILOG = """\
examples:
  hybrid-bench --suite baselines --budget cpu --out runs/bench      # one suite (≤ 60 min on 2 cores)
  hybrid-bench --suite all --budget smoke --out runs/smoke           # every suite in minutes
  hybrid-bench --suite placements --budget cpu --seeds 0 --models qk,nope,v
  hybrid-bench --suite baselines --out runs/bench --report-only      # rewrite report.md from the records
  hybrid-bench --suite baselines --models hybrid,transformer-window --set rnn_r_max=0.9999 --out runs/decay
  hybrid-bench --suite baselines --budget long --window 16 --models transformer,transformer-window --out runs/w16
  hybrid-bench --suite baselines --budget gpu-long --models transformer,transformer-window,hybrid,hybrid-selective
               --data .corpus --compile --max-minutes 8 --seeds 0 --out runs/gpu-long   # one H100 command
  hybrid-bench --suite baselines --budget gpu-long --dry-run --out runs/dry    # the same suite, tiny, on the CPU

outputs in OUT/<suite>/: results.jsonl (one record per finished run), <model>/seed<k>/ (run directories that
hybrid.train.load_run opens), report.md and its PNG plots. Run the same command again to continue.
"""


def bench_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hybrid-bench", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Train the hybrids and the Transformer / RetNet baselines on equal budgets; report "
                           "quality at and beyond the training length, speed and memory.")
    p.add_argument("--suite", required=True, choices=[*SUITES, "all"], help="which suite (or all four)")
    p.add_argument("--budget", default=None, choices=list(BUDGETS),
                   help="smoke: minutes, for tests; cpu: ≤ 60 min per suite on 2 cores; long: L 1024 on 2 cores; "
                        "gpu: ≈ 1 GPU-hour per suite; gpu-long: L 2048, one seed of the four long-context models in "
                        "≤ 8 min of an H100 (hybrid.train.bench.budgets) (default: smoke; with --report-only, "
                        "the records')")
    p.add_argument("--out", default="runs/bench", help="suite directories go here (default: runs/bench)")
    # the options a run config declares, the budget's values unless given (hybrid.train.options)
    add_option_flags(p, LoopOptions, ["steps"], default=None, default_text="the budget's")
    add_option_flags(p, DataOptions, ["seq_len"], default=None, default_text="the budget's L")
    p.add_argument("--window", type=positive_int, default=None,
                   help="override the budget's attention window: the windowed models' and the past-the-window "
                        "buckets' (fewer tokens than L; use a fresh --out) (default: the budget's)")
    p.add_argument("--seeds", default=None, help="seeds, e.g. 0,1,2 (default: the budget's)")
    p.add_argument("--models", default=None,
                   help="only these models of the suite, e.g. transformer,hybrid (default: all of them)")
    add_set_flag(p, help="a HybridConfig field for every model of the suite, VALUE parsed as JSON (e.g. --set "
                         "rnn_r_max=0.9999); use a fresh --out, the records do not mix settings; repeatable "
                         "(default: none)")
    add_option_flags(p, TrainConfig, ["data"], default=None)
    add_option_flags(p, TrainConfig, ["skip_rows_without_text"], default=False)
    add_option_flags(p, TrainConfig, ["tokenizer"], default=None)
    add_device_flag(p)
    add_option_flags(p, TrainConfig, ["compile"], default=False, help={"compile": "in each run's training steps (the measurements run eager)"})
    add_threads_flag(p)
    p.add_argument("--dry-run", action="store_true",
                   help="rehearse the suite on the CPU at the smoke budget's sizes, eager: the budget's models, "
                        "seeds and sizing rule, the measurements and the report, in seconds (use a fresh --out) "
                        "(default: off)")
    p.add_argument("--max-minutes", type=finite_float(0.0, low_open=True), default=None, metavar="M",
                   help="start a run only while the minutes left (counted from the command's start) hold the "
                        "longest run so far; the command then ends with the finished runs' records written, and "
                        "the same command continues (default: no limit)")
    p.add_argument("--report-only", action="store_true",
                   help="write the reports from the records, train nothing (default: off)")
    p.add_argument("--overwrite", action="store_true",
                   help="start each suite over in OUT/<suite> (its records and runs removed) instead of continuing it "
                        "(default: off)")
    add_log_flag(p, what="each run once it finishes: its metrics.jsonl, measurements and config")
    p.add_argument("--quiet", action="store_true", help="no progress bar (default: off)")
    return p


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from ..output.tracking import check_trackers

    check_trackers(args.log)
    inputs = [("--data", data_input(args.data)), ("--tokenizer", args.tokenizer)]
    check_apart("--out", args.out, inputs)  # the output-path rule, before any suite starts
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out: expected a directory, got the file {args.out}")
    if args.report_only and args.overwrite:
        raise ValueError("--overwrite and --report-only contradict each other: one removes the records, the "
                         "other reads them")
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    if args.models is not None and len(suites) > 1:
        raise ValueError("--models: expected a single --suite (model names differ between suites), got --suite all")
    if args.dry_run and args.device not in ("auto", "cpu"):
        raise ValueError(f"--dry-run: expected --device auto or cpu (the rehearsal runs on the CPU), got {args.device}")
    if args.dry_run:
        args.device = "cpu"
        if args.compile:
            print("--dry-run: eager on the CPU (--compile is left to the real run)", flush=True)
            args.compile = False
    from ..bench.harness import check_sets

    check_sets(dict(args.sets))  # before any suite directory is made or cleared
    seeds = None if args.seeds is None else parse_int_list(args.seeds)
    models = None if args.models is None else parse_name_list(args.models)
    command = "hybrid-bench " + " ".join(shlex.quote(a) for a in argv)
    time_limit = None if args.max_minutes is None else TimeLimit(60 * args.max_minutes)
    try:
        for name in suites:
            _run_suite(args, name, command, seeds, models, inputs, time_limit)
    except KeyboardInterrupt:  # the finished runs are in results.jsonl: the same command continues
        again = "hybrid-bench " + " ".join(shlex.quote(a) for a in argv if a != "--overwrite")
        raise KeyboardInterrupt(f"; the finished runs are kept in {args.out}; continue with: {again}") from None
    return 0


def _run_suite(args, name: str, command: str, seeds, models, inputs, time_limit: TimeLimit | None) -> None:
    """Train (or continue) one suite and write its report, holding the suite directory's lock (one writer)."""
    from ..bench.harness import run_bench
    from ..bench.report import write_bench_report

    budget = _flag_budget(args, name, seeds, models)
    directory = Path(args.out) / name
    if args.report_only:
        _report_only(args, name, directory, budget, command, inputs)
        return
    print(f"suite {name!r} → {directory}/\n{budget.describe()}", flush=True)
    with lock_run_dir(directory, command="hybrid-bench", what=f"--out ({name})", inputs=inputs):
        prepare_suite_dir(directory, overwrite=args.overwrite, what=f"--out ({name})", inputs=inputs)
        if not sys.stderr.isatty():  # datasets' bars are carriage-return animations: not in a log file
            import datasets

            datasets.disable_progress_bars()
        records = run_bench(name, budget, out=args.out, data=args.data, tokenizer=args.tokenizer,
                            device=args.device, sets=dict(args.sets), verbose=not args.quiet,
                            skip_rows_without_text=args.skip_rows_without_text, compile=args.compile,
                            time_limit=time_limit, command=command)
        if args.log:
            _log_runs(args.log, directory, name, records)
        if time_limit is not None and time_limit.left_runs:
            print(f"--max-minutes: {time_limit.describe()}; the same command continues", flush=True)
        if not records:
            return
        path = write_bench_report(directory, name, records, budget_text=budget.describe(), command=command)
        print(f"report: {path}", flush=True)
        note = runs_left_out(directory, records)
        if note:
            print(note, flush=True)


def runs_left_out(directory: Path, records: list[dict]) -> str | None:
    """A line naming the runs of other commands (other --models, --seeds) in the suite folder that the training
    path's report, of this command's ``records`` alone, leaves out; None when there are none."""
    others = set(ResultsLog(directory).by_run()) - {r["run"] for r in records}
    if not others:
        return None
    return (f"the report covers this command's {len(records)} runs; {directory / 'results.jsonl'} holds "
            f"{len(others)} more ({', '.join(sorted(others))}): add --report-only to report them all")


def _flag_budget(args, name: str, seeds, models):
    """The budget the flags ask for: ``--budget`` (smoke), ``--dry-run``, then the overrides."""
    budget = bench_budget(args.budget or "smoke", name)
    if args.dry_run:
        budget = dry_run(budget)
    budget = budget.override(steps=args.steps, seq_len=args.seq_len, seeds=seeds, models=models,
                             known_models=list(SUITES[name].models))
    return check_window(budget if args.window is None else with_window(budget, args.window))


def _report_only(args, name: str, directory: Path, budget, command: str, inputs) -> None:
    """``--report-only``: the report of the records as they were trained, under their budget and command; a flag
    that asks for another budget is refused (the report would describe other runs than its tables)."""
    from ..bench.report import write_bench_report

    # a run recorded twice (two sessions' files joined by hand) counts once, its later record, as training's report
    records = list(ResultsLog(directory).by_run().values())
    if not records:
        raise ValueError(f"--report-only: expected records in {directory / 'results.jsonl'}, found none")
    budgets = recorded_budgets(records)
    _check_report_flags(args, budget, budgets, directory / "results.jsonl")
    budget_text = "\n\n".join(b.describe() for b in budgets) or budget.describe()
    print(f"suite {name!r} → {directory}/ (from its records)\n{budget_text}", flush=True)
    with lock_run_dir(directory, command="hybrid-bench", what=f"--out ({name})", inputs=inputs):
        if args.log:
            _log_runs(args.log, directory, name, records)
        commands = _training_commands(records, directory / "report.md")
        path = write_bench_report(directory, name, records, budget_text=budget_text, commands=commands,
                                  rewritten_by=command)
        print(f"report: {path}", flush=True)


def _budget_flags(name: str) -> str:
    """A budget's name as the flags that give it: ``gpu-long (dry run)`` → ``--budget gpu-long --dry-run``."""
    base = name.removesuffix(" (dry run)")
    return f"--budget {base}" + (" --dry-run" if base != name else "")


def _check_report_flags(args, budget, budgets: list, results: Path) -> None:
    """``--budget``, ``--dry-run``, ``--steps``, ``--seq-len`` and ``--window``, where given with ``--report-only``,
    must name the records' values (``--seeds`` and ``--models`` choose runs: the records may hold fewer)."""
    given = "--budget" if args.budget is not None else "--dry-run"
    asked = [(given, _budget_flags(budget.name), {_budget_flags(b.name) for b in budgets},
              args.budget is not None or args.dry_run),
             ("--steps", budget.steps, {b.steps for b in budgets}, args.steps is not None),
             ("--seq-len", budget.seq_len, {b.seq_len for b in budgets}, args.seq_len is not None),
             ("--window", budget.extra.get("window"), {b.extra.get("window") for b in budgets},
              args.window is not None)]
    for flag, value, recorded, is_given in asked:
        if is_given and recorded and recorded != {value}:
            shown = ", ".join(sorted(map(str, recorded)))
            raise ValueError(f"{flag}: expected the records' {shown} ({results}), got {value}; --report-only "
                             f"reports the runs as they were trained: leave {flag} out")


def _training_commands(records: list[dict], report: Path) -> list[str]:
    """The commands that trained ``records``: theirs, and where some records keep none (written before records
    kept it), the commands the previous ``report`` names."""
    recorded = list(dict.fromkeys(r["command"] for r in records if r.get("command")))
    if all(r.get("command") for r in records):
        return recorded
    from ..bench.report import report_commands

    return [c for c in report_commands(report) if c not in recorded] + recorded


def _log_runs(kinds, directory: Path, suite: str, records: list[dict]) -> None:
    """Each finished run of the suite to the trackers, once (hybrid.train.output.tracking.replay_run)."""
    from ..output.tracking import replay_run

    for record in records:
        run_dir = directory / record["run"]
        if run_dir.is_dir():
            replay_run(kinds, run_dir, record["config"], summary=record.get("metrics") or {}, group=suite)


def bench_main(argv: list[str] | None = None) -> int:
    """``hybrid-bench``: returns the exit status (the console script exits with it)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_command(bench_parser(), argv, lambda args: _run(args, argv))


if __name__ == "__main__":
    sys.exit(bench_main())
