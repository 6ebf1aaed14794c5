"""Command lines: ``hybrid-train`` (= ``python -m hybrid.train``) and ``hybrid-generate``.

User errors (a missing data path, an unknown preset, a corrupt checkpoint, an offline hub name, a bad
value) print one line, ``<prog>: error: …``, to stderr and exit with status 2; a diverged run exits with 1
and an interrupted one with 130. ``HYBRID_TRACEBACK=1`` shows the full traceback instead (``hybrid.train.cli.parts``).
"""
from __future__ import annotations

import argparse
import os
import shlex

from ..lm.config import TrainConfig
from ..parallel.device import env_int
from hybrid.models.modes import DEFAULT_CHUNK_SIZE

from .flags import (MODEL_FLAGS, absolute_inputs, add_config_flags, add_device_flag, add_model_flags, add_run_flags,
                    add_threads_flag, config_from_args)
from .parts import Parser, UsageError, count, finite_float, positive_int, run_command

__all__ = ["train_main", "generate_main", "train_parser", "generate_parser", "config_from_args",
           "train_config_from_args", "MODEL_FLAGS"]


TRAIN_EPILOG = """\
examples:
  hybrid-train                                    # tiny hybrid on this Python's stdlib sources (CPU: minutes)
  hybrid-train --preset transformer --steps 2000 --out runs/tf
  hybrid-train --data ~/texts --tokenizer tokenizer.json --size small --seq-len 1024 --out runs/mine
  hybrid-train --pattern RRRA --set rnn_selective=true --set carope=true
  hybrid-train --resume runs/tf --steps 4000      # continue a run; --steps is the new total
  hybrid-train --config run.toml --steps 4000     # options from a TOML / JSON file (a train_config.json is one)
  hybrid-train --log tensorboard --out runs/tb    # also to TensorBoard (OUT/tensorboard/) or W&B (--log wandb)
  torchrun --nproc-per-node 4 -m hybrid.train --size small --batch-size 16 --out runs/ddp   [--fsdp]
  hybrid-generate --run runs/tf --prompt "def " --max-new-tokens 200

outputs in --out: checkpoint/ (resumable), metrics.jsonl, loss.png, train_config.json (and tensorboard/ or
wandb/ with --log); Ctrl-C names the checkpoint that survived and the command that resumes it
"""


def train_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hybrid-train",
        description="Train a hybrid language model. With no arguments: the tiny hybrid preset (RRA: two VO-RoPE "
                    "recurrence layers per attention layer) on this Python's standard-library sources, on the "
                    "CPU or GPU, checkpoints and metrics in runs/train.",
        epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE",
                   help="a .toml or .json file of TrainConfig fields (a run's train_config.json is one); flags "
                        "given here override it (docs/training.md, 'Config files') (default: none)")
    # every TrainConfig option (hybrid.train.options.sections); one left out keeps its default, or on --resume its
    # saved value
    groups = add_config_flags(p, TrainConfig)
    add_model_flags(groups["model"], set_help="any HybridConfig field, VALUE parsed as JSON (e.g. --set carope=true "
                                              "--set rope_scaling='{\"rope_type\": \"linear\", \"factor\": 4}'); "
                                              "repeatable")
    add_run_flags(groups["loop"], resume="continue the run in DIR from its checkpoint (same data order, optimizer "
                                         "and RNG); change --steps, the intervals, --lr, --warmup, --weight-decay, "
                                         "--grad-clip; a flag that defines the run (model, data, --init-from, …) is "
                                         "refused (docs/training.md, 'Resume')",
                  overwrite="start over in an --out that holds a run (its checkpoints, metrics and config are "
                            "removed) or other files (kept beside the new run); without it such an --out is refused")
    add_threads_flag(groups["execution"], default=argparse.SUPPRESS)
    return p


def train_config_from_args(args: argparse.Namespace) -> dict:
    """``config_from_args`` over the ``--config`` file's fields, when one is given: a flag overrides the file's
    value, a ``--set`` / model flag one model field, however either spells it (``window`` / ``attention.window``)."""
    given = config_from_args(args)
    if getattr(args, "config", None) is None:
        return given
    from hybrid.models.config_overrides import merge_model
    from .config_file import load_config_file

    base = load_config_file(args.config)
    merged = {**base, **given}
    if "model" in base or "model" in given:
        merged["model"] = merge_model(base.get("model", {}), given.get("model", {}))
    return merged


def _interrupted(trainer) -> str:
    """What survived a Ctrl-C, and the command that continues: "at step 37; the checkpoint of step 20 …"."""
    from ..loop.checkpoint import latest_checkpoint

    step = getattr(trainer, "step", None)
    at = "before training started" if step is None else f"at step {step}"
    saved = latest_checkpoint(trainer.out)
    if saved is None:
        return (f"{at}, before the first checkpoint (--save-every {trainer.config.save_every}): nothing to resume; "
                f"run the same command again to start over")
    world, local = env_int("WORLD_SIZE", 1), os.environ.get("LOCAL_WORLD_SIZE")
    if world > 1 and local == str(world):
        command = f"torchrun --nproc-per-node {world} -m hybrid.train"
    elif world > 1:
        command = "torchrun (the same options) -m hybrid.train"
    else:
        command = "hybrid-train"
    saved_step, path = saved
    return (f"{at}; the checkpoint of step {saved_step} survived in {path}; resume with: "
            f"{command} --resume {shlex.quote(str(trainer.out))}")


def _train(args: argparse.Namespace) -> int:
    from ..lm.trainer import Trainer
    from ..loop.checkpoint import run_dir_of
    from ..output.tracking import check_trackers

    given = absolute_inputs(train_config_from_args(args))
    if "init_from" in vars(args):  # the architecture is the source run's: a --preset / --size would not apply
        for flag in ("preset", "size"):
            if flag in vars(args):
                raise UsageError(f"--{flag}: the architecture comes from --init-from; expected no --{flag} with it, "
                                 f"got --{flag} {getattr(args, flag)}")
    kwargs = dict(verbose=0 if args.quiet else 2)
    if args.quiet:
        import datasets

        datasets.disable_progress_bars()  # "Generating train split", "tokenising", "Downloading data"
        datasets.logging.set_verbosity_error()
        kwargs["progress"] = False
    if args.resume:
        if "out" in given and os.path.abspath(given["out"]) != os.path.abspath(run_dir_of(args.resume)):
            raise UsageError(f"--out {given['out']} and --resume {args.resume} name different run directories; "
                             f"a resumed run writes to its own directory")
        if args.overwrite:
            raise UsageError("--overwrite and --resume contradict each other: one starts over, the other continues")
        trainer = Trainer.from_checkpoint(args.resume, trainer_kwargs=kwargs, **given)
    else:
        config = TrainConfig(**given)
        if args.config is not None:  # the output-path rule: the run directory never holds the file it was read from
            from ..output.paths import check_apart

            check_apart("--out", config.out, [("--config", args.config)])
        trainer = Trainer(config, overwrite=args.overwrite, **kwargs)
    check_trackers(trainer.config.log)  # a missing tensorboard / wandb package: now, not after the data
    try:
        trainer.fit()
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_interrupted(trainer)) from None
    return 0


def train_main(argv: list[str] | None = None) -> int:
    """``hybrid-train``: returns the exit status (the console script exits with it)."""
    return run_command(train_parser(), argv, _train)  # which collects an FSDP2 model's cycles under torchrun

# ---------------------------------------------------------------------------------------------- generate


def generate_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hybrid-generate",
        description="Continue a prompt with the model of a training run (its checkpoint and tokenizer). The "
                    "prompt is read as the start of a document; the prompt and its continuation are printed.",
        epilog="examples:\n  hybrid-generate --run runs/train --prompt $'import os\\n' --temperature 0.8 --top-k 40\n"
               "  hybrid-generate --run runs/train --prompts prompts.jsonl --max-batch 16 > outputs.jsonl\n"
               "  ($'…' is bash's quoting that turns \\n into a newline; \"…\" passes a backslash and an n)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", required=True, metavar="DIR",
                   help="run directory (its checkpoint/) or a checkpoint directory")
    p.add_argument("--prompt", default="", help="text to continue (default: empty: a fresh document)")
    p.add_argument("--prompts", metavar="FILE", default=None,
                   help="a file of prompts (.jsonl: JSON strings or objects with per-prompt options; otherwise one "
                        "per line), decoded together with continuous batching; one JSON line per prompt on stdout "
                        "(default: none, --prompt)")
    p.add_argument("--max-batch", type=positive_int, default=8,
                   help="with --prompts: prompts decoded at once (default: 8)")
    p.add_argument("--max-new-tokens", type=count, default=200, help="tokens to generate (default: 200)")
    p.add_argument("--mode", choices=["recurrent", "parallel", "chunked"], default="recurrent",
                   help="recurrent: O(1) state per token; parallel/chunked: recompute the whole sequence per "
                        "token (the slow reference) (default: recurrent)")
    p.add_argument("--prefill", choices=["parallel", "chunked"], default="parallel",
                   help="how the recurrent mode reads the prompt (default: parallel)")
    p.add_argument("--chunk-size", type=positive_int, default=None,
                   help=f"block size of chunked processing (default: {DEFAULT_CHUNK_SIZE})")
    p.add_argument("--temperature", type=finite_float(0.0), default=0.8, help="0 = greedy (default: 0.8)")
    p.add_argument("--top-k", type=positive_int, default=None,
                   help="sample among the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=finite_float(0.0, low_open=True, high=1.0), default=None,
                   help="sample from the smallest set of mass >= p, p in (0, 1] (default: 1, all)")
    p.add_argument("--seed", type=count, default=0, help="sampling seed (default: 0)")
    p.add_argument("--no-stop", action="store_true", help="keep going past the end-of-document token (default: off)")
    p.add_argument("--compile", action="store_true",
                   help="run the decode steps under torch.compile (dynamic shapes: one compile serves every step; the "
                        "prompts' prefill stays eager); with --mode recurrent (default: off)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="record the decode step once as a CUDA graph and replay it for every token (a GPU's decoding "
                        "is bound by kernel launches); with --compile, the compiled step is recorded (fewer "
                        "kernels); with --mode recurrent on a CUDA device (default: off)")
    add_device_flag(p)
    add_threads_flag(p)
    return p


def _generate(args: argparse.Namespace) -> int:
    from ..parallel.device import resolve_device
    from ..lm.inference import generate_text, load_run

    if args.compile and args.mode != "recurrent":
        raise UsageError(f"--compile: expected --mode recurrent (it compiles the decode steps), got --mode {args.mode}")
    if args.cuda_graph and args.mode != "recurrent":
        raise UsageError(f"--cuda-graph: expected --mode recurrent (it records the decode step), got --mode "
                         f"{args.mode}")
    device = resolve_device(args.device)
    if args.cuda_graph and device.type != "cuda":
        raise UsageError(f"--cuda-graph: expected a CUDA device (--device cuda), got {device.type}")
    compile = ("compiled-cuda-graph" if args.compile else "cuda-graph") if args.cuda_graph else args.compile
    if args.prompts is not None:
        if args.prompt or args.mode != "recurrent":
            raise UsageError("--prompts: expected no --prompt and --mode recurrent (the prompts of the file are "
                             "decoded together), got " + ("--prompt" if args.prompt else f"--mode {args.mode}"))
        from ..lm.generate_file import generate_file

        run = load_run(args.run, device=device)
        generate_file(run, args.prompts, max_batch=args.max_batch, prefill=args.prefill, chunk_size=args.chunk_size,
                      max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                      top_p=args.top_p, seed=args.seed, stop_at_eos=not args.no_stop, compile=compile)
        return 0
    run = load_run(args.run, device=device)
    text = generate_text(run, args.prompt, max_new_tokens=args.max_new_tokens, mode=args.mode,
                         prefill=args.prefill, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                         seed=args.seed, stop_at_eos=not args.no_stop, chunk_size=args.chunk_size,
                         compile=compile)
    print(text)
    return 0


def generate_main(argv: list[str] | None = None) -> int:
    """``hybrid-generate``: returns the exit status."""
    return run_command(generate_parser(), argv, _generate)
