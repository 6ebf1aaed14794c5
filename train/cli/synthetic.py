"""``hybrid-synthetic`` (= ``python -m hybrid.train.cli.synthetic``): one model on one task, or a whole suite.

User errors print one line, ``hybrid-synthetic: error: …``, and exit 2; an interrupted suite exits 130 and the
same command continues it (``hybrid.train.cli.parts``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..options.sections import DataOptions
from ..output.outdir import check_output_dir, prepare_suite_dir, staged_output_dir
from ..output.paths import data_input
from ..output.progress import progress_bar
from ..output.run_lock import lock_run_dir
from ..suite import markdown_table, parse_int_list, parse_name_list
from ..tasks import TASK_NAMES, make_task
from ..tasks.passkey import suites as passkey_suite
from ..tasks.suites import (BUDGETS, G_MODELS, MODELS, SUITES, budget_for, curriculum_steps, default_lr,
                            model_entry, model_shape, run_synthetic_suite, task_lrs, task_params, task_steps)
from ..tasks.train import TaskRunConfig, train_task
from .flags import add_device_flag, add_log_flag, add_option_flags, add_threads_flag
from .parts import Parser, add_set_flag, run_command

EPILOG = """\
examples:
  hybrid-synthetic --task parity --model vo-rnn-recipe --out runs/parity      # the state-tracking recipe, its best rate
  hybrid-synthetic --task parity --preset vo-rnn --set rnn_phase='"data"' --out runs/parity-data
  hybrid-synthetic --suite state-tracking --budget cpu --out runs/synth
  hybrid-synthetic --suite all --budget smoke --out runs/synth-smoke      # state tracking + MQAR, every model, seconds
  hybrid-synthetic --suite mqar --budget cpu --models transformer,vo-rnn-data --seeds 0,1 --out runs/mqar
  hybrid-synthetic --task passkey --preset hybrid --seq-len 1024 --curriculum 64,256 --curriculum-steps 2400 \\
      --steps 3000 --out runs/pk-1024      # 1200 steps at 64, 1200 at 256, then 600 at 1024
  hybrid-synthetic --task passkey-text --init-from runs/demo --steps 1500 --curriculum-steps 0 --out runs/demo-passkey
                                       # Samba's test: the trained LM fine-tuned on passkey retrieval, then scored

models: """ + ", ".join(MODELS) + """
the parity study's candidates (vo-rnn-data-selective with one change, or two; docs/research/synthetic-tasks.md,
"Parity, reliably") run from the study's own suite: --suite parity-recipe [--models CANDIDATE,...]
the G mixer (matrix-state VO-RoPE, issue 46), by --model or --models: """ + ", ".join(G_MODELS) + """
outputs: a run directory per task/model/lr/seed (checkpoint/, task.json, results.json, metrics.jsonl);
a suite adds results.jsonl (one record per finished run; a second invocation resumes) and report.md + PNGs
"""


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hybrid-synthetic", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Synthetic capability tasks: parity and modular arithmetic (state tracking), MQAR "
                           "(associative recall). Train one model on one task, or run a suite of models.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--task", choices=TASK_NAMES, help="train one model on this task")
    what.add_argument("--suite", choices=sorted(SUITES),
                      help="run every model of the budget on these tasks; all = state-tracking and mqar (the "
                           "parity-recipe study and the passkey suites run on their own)")
    p.add_argument("--budget", choices=list(BUDGETS), default="cpu",
                   help="sizes, steps, lengths, seeds and learning rates (default: cpu)")
    p.add_argument("--out", required=True, help="the run directory (--task) or the suite directory (--suite)")
    # the options a run config declares, the budget's values unless given (hybrid.train.options)
    add_option_flags(p, TaskRunConfig, ["steps"], default=None, default_text="the budget's")
    add_option_flags(p, DataOptions, ["seq_len"], default=None, default_text="the budget's",
                     help={"seq_len": "a task's longest training length (not MQAR's: its grid sets its lengths)"})
    p.add_argument("--seeds", help="comma-separated seeds, e.g. 0,1,2; one with --task (default: the budget's; "
                                   "--task takes its first)")
    p.add_argument("--models", help="comma-separated suite models: " + ", ".join(MODELS)
                   + "; --suite parity-recipe takes its candidates too (default: the budget's)")
    add_device_flag(p)
    add_threads_flag(p)
    p.add_argument("--overwrite", action="store_true",
                   help="--task: replace a non-empty --out; --suite: start the suite over instead of continuing it "
                        "(default: off)")
    add_log_flag(p, what="each run once it finishes: its metrics.jsonl, results and config")
    p.add_argument("--quiet", action="store_true", help="no progress bar (default: off)")
    g = p.add_argument_group("one run (--task)")
    add_option_flags(g, TaskRunConfig, ["preset"], default=None, default_text="vo-rnn")
    g.add_argument("--model", choices=[*MODELS, *G_MODELS],
                   help="a suite model by name: its preset, options and run options (e.g. vo-rnn-recipe, the "
                        "state-tracking recipe); instead of --preset (default: none)")
    add_set_flag(g, help="any HybridConfig field, VALUE parsed as JSON (e.g. --set rnn_phase='\"data\"'); the "
                         "budget sets d_model, n_layers and n_heads (--set overrides them too); repeatable "
                         "(default: none)")
    add_option_flags(g, TaskRunConfig, ["lr"], default=None, default_text="the measured best rate of the suite model "
                     "this run is, else the largest of the budget's grid; printed")
    add_option_flags(g, TaskRunConfig, ["batch_size"], default=None, default_text="the budget's")
    g.add_argument("--curriculum", metavar="LENGTHS",
                   help="passkey tasks: the curriculum's lengths, comma-separated and increasing, each a stage of "
                        "equal steps before the training length (e.g. 64,256 before --seq-len 1024) (default: a "
                        "quarter of the training length)")
    add_option_flags(g, TaskRunConfig, ["curriculum_steps"], default=None, default_text="the budget's share of "
                                                                                      "the steps")
    add_option_flags(g, TaskRunConfig, ["init_from"], default=None, default_text="none, a fresh model", help={
        "init_from": "passkey-text: fine-tune this trained byte-level LM (a hybrid-train or hybrid-distill run) "
                     "instead of a fresh model, as Samba's passkey test; --set may change what keeps the weights' "
                     "shapes"})
    g.add_argument("--edge-share", type=float, metavar="S",
                   help="passkey tasks: the share of training sequences whose key sits within key_digits positions "
                        "of an edge (the sequence's start, or right before the query) (default: 0, uniform)")
    return p


def _curriculum_lengths(text: str) -> list[int]:
    """``"64,256"`` → [64, 256] (the --curriculum flag; ranges are the task's to check)."""
    return list(parse_int_list(text, "--curriculum", "64,256"))


# args attribute -> (flag, the task parameter it sets, what it is, the flag's text to the parameter's value)
PASSKEY_FLAGS = {"curriculum": ("--curriculum", "curriculum_length", "a length curriculum", _curriculum_lengths),
                 "edge_share": ("--edge-share", "edge_share", "keys at the edges", float)}


def _passkey_params(args, params: dict) -> dict:
    """The task parameters with --curriculum's lengths and --edge-share, checked by the task (its error names the
    flag)."""
    for attr, (flag, name, what, convert) in PASSKEY_FLAGS.items():
        if getattr(args, attr) is None:
            continue
        if args.task not in passkey_suite.TASKS:
            raise ValueError(f"{flag}: expected a passkey task ({what}), got --task {args.task}")
        params = {**params, name: convert(getattr(args, attr))}
        try:
            make_task(args.task, **params)
        except ValueError as e:
            raise ValueError(str(e).replace(f"{name}:", f"{flag}:", 1)) from None
    return params


# a run setting's name in an error -> the flag that gave it (when the flag was given)
FLAG_OF_FIELD = {"lr": "--lr", "seed": "--seeds", "init_from": "--init-from", "train_lengths": "--seq-len",
                 "train_length": "--seq-len"}


def _flag_named(args, message: str) -> str:
    """``message`` (``"name: …"``) with the flag that set ``name`` in front, when that flag was given."""
    name, _, rest = message.partition(":")
    flag = FLAG_OF_FIELD.get(name)
    attr = flag and flag[2:].replace("-", "_")  # argparse's attribute of the flag
    if flag is None or getattr(args, attr) is None:
        return message
    return f"{flag}{'' if attr == name else f' ({name})'}:{rest}"


def _one_run(args, budget, inputs) -> int:
    seed = budget.seeds[0]
    steps = task_steps(budget, args.task)
    if args.init_from is not None:
        for flag, given in (("--model", args.model), ("--preset", args.preset)):
            if given is not None:
                raise ValueError(f"{flag}: the architecture comes from --init-from; expected no {flag} with it, "
                                 f"got {flag} {given}")
        preset, base, options = None, {}, {}
    elif args.model is not None:
        if args.preset is not None:
            raise ValueError(f"--model: names a preset and its options; expected no --preset with it, got "
                             f"--preset {args.preset}")
        if args.task in passkey_suite.TASKS:
            raise ValueError(f"--model: expected a state-tracking or MQAR task, got --task {args.task}")
        preset, base, options = model_entry(args.model)
    else:
        preset, base, options = args.preset or "vo-rnn", {}, {}
    overrides = {**base, **dict(args.sets)}
    model = overrides if preset is None else {**model_shape(budget, args.task, preset), **overrides}
    if args.lr is not None:
        lr, why = args.lr, "--lr"
    elif preset is None:
        lr, why = min(task_lrs(budget, args.task)), f"the smallest of the {budget.name} budget's grid (a fine-tune)"
    else:
        lr, why = default_lr(budget, args.task, preset, overrides, options)
    cur_steps = curriculum_steps(budget, args.task, steps) if args.curriculum_steps is None else args.curriculum_steps
    if cur_steps > steps:
        raise ValueError(f"--curriculum-steps: expected at most the run's {steps} steps, got {cur_steps}")
    try:  # a bad --set fails here, before training; a fault of a flag's value names the flag
        config = TaskRunConfig(task=args.task, task_params=_passkey_params(args, task_params(budget, args.task)),
                               preset=preset, model=model, steps=steps,
                               batch_size=args.batch_size or budget.batch_size, curriculum_steps=cur_steps, lr=lr,
                               seed=seed, eval_size=budget.eval_size, device=args.device, init_from=args.init_from,
                               **({"size": None} if preset is None else {}), **options)
        model_config = config.model_config(make_task(config.task, **config.task_params))
    except ValueError as e:
        raise ValueError(_flag_named(args, str(e))) from None
    print(run_block(config, model_config, budget, lr, why), flush=True)  # the run it makes, before training
    print(f"run: {json.dumps(config.to_dict())}", flush=True)
    bar = None
    if not args.quiet:  # a tqdm bar on a terminal, plain lines in a log file
        bar = progress_bar(total=config.steps, desc=args.task, unit="step")
    try:
        with staged_output_dir(args.out, overwrite=args.overwrite, what="--out", inputs=inputs,
                               command="hybrid-synthetic") as stage:  # whole or nothing, one writer
            results = train_task(config, stage, on_step=(lambda s, loss: (bar.update(1), bar.set_postfix(loss=f"{loss:.4f}")))
                                 if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    if args.log:
        from ..output.tracking import replay_run

        replay_run(args.log, args.out, config.to_dict(), summary=_summary(results))
    print(results_table(results))
    print(f"status {results['status']}; results in {Path(args.out) / 'results.json'}")
    return 0 if results["status"] == "finished" else 1


def results_table(results: dict) -> str:
    """A run's scores as a markdown table: validation and every test point. Passkey's validation scores each digit,
    so its row is "per digit" beside the tests' exact match; the other tasks add the most common answer's
    accuracy, the floor when answers are not uniform."""
    points = list(results["accuracy"])

    def row(name: str, valid, scores: dict) -> list[str]:
        return [name, "" if valid is None else score_text(valid)] + [score_text(scores[p]) for p in points]

    if "digit_accuracy" in results:
        rows = [row("exact match", None, results["accuracy"]),
                row("per digit", results["valid_accuracy"], results["digit_accuracy"])]
    else:
        rows = [row("accuracy", results["valid_accuracy"], results["accuracy"])]
    rows.append(row("scaled", None, results["scaled_accuracy"]))
    if "majority_accuracy" in results:
        rows.append(row("most common answer", None, results["majority_accuracy"]))
    return markdown_table(["", "valid"] + points, rows)


def score_text(value: float) -> str:
    """A score to 4 places; a value that rounds to zero shows as 0.0000, never -0.0000."""
    return f"{round(value, 4) + 0.0:.4f}"


def run_block(config: TaskRunConfig, model_config, budget, lr: float, why: str) -> str:
    """What the run does, as it will run (the budget's defaults with the command line's flags applied)."""
    shape = (f"pattern {model_config.layer_types}, d_model {model_config.d_model}, {model_config.n_layers} layer"
             f"{'s' if model_config.n_layers != 1 else ''}, {model_config.n_heads} heads")
    model = f"from {config.init_from} ({shape})" if config.init_from else f"{config.preset} ({shape})"
    lines = [f"run: --task {config.task} (defaults from the {budget.name!r} budget, then the flags given)",
             f"  model       {model}",
             f"  steps       {config.steps} ({config.curriculum_steps} on the curriculum)",
             f"  batch_size  {config.batch_size}",
             f"  learning rate {lr:g}: {why}",
             f"  seed        {config.seed}",
             f"  eval_size   {config.eval_size}",
             f"  task        {json.dumps(config.task_params)}"]
    return "\n".join(lines)


def _summary(metrics: dict) -> dict:
    """The numbers of a run's results (accuracy per test point, …), for the trackers."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, dict)) and not isinstance(v, bool)}


def _log_suite(kinds, out: Path, suite: str) -> None:
    from ..suite import ResultsLog
    from ..output.tracking import replay_run

    for record in ResultsLog(out).by_run().values():  # a run recorded twice is logged once
        run_dir = out / record["run"]
        if run_dir.is_dir():
            replay_run(kinds, run_dir, record["config"], summary=_summary(record["metrics"]), group=suite)


def _run(args: argparse.Namespace) -> int:
    from ..output.tracking import check_trackers

    check_trackers(args.log)
    inputs = [("--init-from", args.init_from)]
    if "passkey-text" in (args.task, args.suite):  # its filler: the standard library's sources
        inputs.append(("the passkey-text corpus", data_input(None)))
    if args.task is not None:
        check_output_dir(args.out, overwrite=args.overwrite, what="--out", inputs=inputs)
    seeds = parse_int_list(args.seeds) if args.seeds is not None else None
    if args.task is not None and seeds is not None and len(seeds) > 1:
        raise ValueError(f"--seeds: expected one seed with --task (one run; a --suite runs several seeds), got "
                         f"{args.seeds}")
    if args.task is not None and args.models is not None:
        raise ValueError(f"--models: expected no --models with --task (one run: --model or --preset names its "
                         f"model; --models picks among a --suite's), got --models {args.models}")
    if args.seq_len is not None and "mqar" in (args.task, args.suite):
        raise ValueError(f"--seq-len: expected no --seq-len with {'--task' if args.task else '--suite'} mqar (its "
                         f"lengths are the budget's MQAR grid), got {args.seq_len}")
    models = parse_name_list(args.models) if args.models is not None else None
    budget = budget_for(args.budget, steps=args.steps, seq_len=args.seq_len, seeds=seeds, models=models,
                        suite=args.suite or args.task)
    if args.suite is None:
        try:
            return _one_run(args, budget, inputs)
        except KeyboardInterrupt:  # a --task run is written whole or not at all
            raise KeyboardInterrupt(f"; nothing was written to {args.out}; run the same command again to start "
                                    f"over") from None
    if (args.sets or args.lr is not None or args.batch_size is not None or args.model or args.preset
            or args.curriculum is not None or args.curriculum_steps is not None or args.edge_share is not None
            or args.init_from is not None):
        raise ValueError("--set, --lr, --batch-size, --model, --preset, --curriculum, --curriculum-steps, "
                         "--edge-share and --init-from: apply to one run (--task); a suite takes its models, rates, "
                         "batch and curriculum from the budget (--models picks among them)")
    try:
        with lock_run_dir(args.out, command="hybrid-synthetic", what="--out", inputs=inputs):  # one writer
            prepare_suite_dir(args.out, overwrite=args.overwrite, inputs=inputs)
            print(budget.describe(), flush=True)
            report = run_synthetic_suite(args.suite, budget, args.out, device=args.device, verbose=not args.quiet)
    except KeyboardInterrupt:  # finished runs are in results.jsonl; the suite continues from them
        raise KeyboardInterrupt(f"; the finished runs are kept in {args.out}; run the same command again to "
                                f"continue the suite") from None
    print(f"report: {report}")
    if args.log:
        _log_suite(args.log, Path(args.out), args.suite)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``hybrid-synthetic``: returns the exit status."""
    return run_command(parser(), argv, _run)


if __name__ == "__main__":
    sys.exit(main())
