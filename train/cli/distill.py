"""``hybrid-distill``: turn a trained Transformer run (ours, or one written by hybrid-import) into a hybrid.

User errors print one line and exit 2 (``hybrid.train.cli.lm``'s conventions); a diverged run exits 1, an
interrupted one 130 with the command that continues it. ``python -m hybrid.train.distill`` is the same command, and
``torchrun --nproc-per-node N -m hybrid.train.distill …`` runs it on N ranks (``hybrid.train.distill.run``).
"""
from __future__ import annotations

import argparse
import shlex

from .parts import (Parser, add_device_flag, add_log_flag, add_set_flag, config_from_args, count,
                         finite_float, int_or, positive_int, run_command)
from ..distill.config import DECAY_INITS, TRAIN_PARTS, DistillConfig

__all__ = ["main", "parser"]

D = DistillConfig(teacher="-", pattern="R")  # the defaults shown in --help

EPILOG = """\
examples:
  hybrid-distill --teacher runs/tf --pattern RRA --window 64 --out runs/tf-rra
  hybrid-distill --teacher runs/llama --keep-attention auto:2 --out runs/llama-hybrid
  hybrid-distill --resume runs/tf-rra --steps 400          # continue; --steps is stage 2's new total
  torchrun --nproc-per-node 4 -m hybrid.train.distill --teacher runs/tf --pattern RRA --batch-size 4 \\
      --out runs/tf-rra-4                                  # 4 ranks × 4: a global batch of 16 sequences per step
  hybrid-generate --run runs/tf-rra --prompt "def "        # the result is a run directory like hybrid-train's

stage 1 aligns each new R layer with the attention layer it replaces (MSE on the teacher's inputs); stage 2
trains the student on KL(teacher || student) of the logits. docs/distill.md has the weight mapping.
outputs in --out: checkpoint/ (the student, resumable), metrics.jsonl, loss.png, distill.json (summary),
layer_ranking.json (auto:K), distill_config.json (rank 0 writes them under torchrun)
"""


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hybrid-distill", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Distil a trained Transformer into a hybrid: replaced attention layers become VO-RoPE "
                           "recurrence (R) layers initialised from their V and O, aligned layer by layer, then "
                           "trained end to end on the teacher's logits.")
    S = argparse.SUPPRESS
    g = p.add_argument_group("teacher and student")
    g.add_argument("--teacher", default=S, metavar="RUN_DIR",
                   help="the teacher's run directory (hybrid-train, hybrid-import or hybrid-distill)")
    g.add_argument("--pattern", default=S,
                   help="R (replace) / A (keep) per layer, repeated and cut at the teacher's n_layers as "
                        "HybridConfig does (RRA on 4 layers: RRAR); at most n_layers letters")
    g.add_argument("--keep-attention", default=S, metavar="auto:K",
                   help="keep the K attention layers whose replacement costs the most KL after stage 1; replace the "
                        "others (the ranking goes to layer_ranking.json)")
    g.add_argument("--window", type=int_or("none"), default=S,
                   help="sliding window of the kept attention layers, or 'none' (default: the teacher's)")
    g.add_argument("--decay-init", choices=DECAY_INITS, default=S,
                   help="the new R layers' decay: attention = per head, the γ whose weights γ^k have the mean "
                        "distance of the replaced attention head on training text; ring = the LRU ring "
                        f"(rnn_r_min…rnn_r_max) (default: {D.decay_init})")
    add_set_flag(g, default=S,
                 help="an option of the new R layers, e.g. --set rnn_selective=true or --set recurrence.rotary_dim=2 "
                      "(recurrence.* fields or their rnn_* names, recompute)")

    g = p.add_argument_group("data (as hybrid-train; the tokenizer is the teacher's)")
    g.add_argument("--data", default=S, metavar="PATH_OR_DATASET", help="default: this Python's stdlib sources")
    g.add_argument("--text-column", default=S, metavar="NAME", help=f"(default: {D.text_column})")
    g.add_argument("--valid-fraction", type=float, default=S, help=f"(default: {D.valid_fraction})")
    g.add_argument("--seq-len", type=positive_int, default=S, help=f"tokens per sequence (default: {D.seq_len})")
    g.add_argument("--packing", choices=("documents", "stream"), default=S, help=f"(default: {D.packing})")
    g.add_argument("--batch-size", type=positive_int, default=S,
                   help=f"sequences per step per rank; under torchrun the global batch is batch_size × ranks, as "
                        f"in hybrid-train (default: {D.batch_size})")

    g = p.add_argument_group("stage 1: alignment (MSE of each R layer against its attention layer)")
    g.add_argument("--align-steps", type=count, default=S, help=f"(default: {D.align_steps})")
    g.add_argument("--align-lr", type=finite_float(0.0, low_open=True), default=S, help=f"(default: {D.align_lr:g})")
    g.add_argument("--align-warmup", type=count, default=S, help="(default: min(100, align steps / 10))")

    g = p.add_argument_group("stage 2: end to end (KL(teacher || student) of the logits)")
    g.add_argument("--steps", type=count, default=S,
                   help=f"stage 2 steps; with --resume the new total (default: {D.steps})")
    g.add_argument("--lr", type=finite_float(0.0, low_open=True), default=S, help=f"(default: {D.lr:g})")
    g.add_argument("--warmup", type=count, default=S, help="(default: min(100, steps / 10))")
    g.add_argument("--temperature", type=finite_float(0.0, low_open=True), default=S,
                   help=f"softmax temperature τ of both; the KL is scaled by τ² (default: {D.temperature:g})")
    g.add_argument("--ce-weight", type=finite_float(0.0), default=S,
                   help=f"add this times the cross-entropy on the data (default: {D.ce_weight:g})")
    g.add_argument("--train", choices=TRAIN_PARTS, default=S,
                   help="all: every weight of the student; new: only the replaced layers' mixers (default: all)")

    g = p.add_argument_group("both stages (AdamW, warmup-cosine per stage)")
    g.add_argument("--min-lr-ratio", type=float, default=S, help=f"(default: {D.min_lr_ratio})")
    g.add_argument("--weight-decay", type=float, default=S, help=f"(default: {D.weight_decay})")
    g.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), default=S, help="(default: 0.9 0.95)")
    g.add_argument("--grad-clip", type=float, default=S, help=f"0 = off (default: {D.grad_clip})")
    g.add_argument("--select-batches", type=positive_int, default=S,
                   help=f"validation batches that rank the layers for auto:K (default: {D.select_batches})")
    g.add_argument("--seed", type=count, default=S, help=f"(default: {D.seed})")

    g = p.add_argument_group("bookkeeping")
    g.add_argument("--out", default=S, metavar="DIR", help=f"run directory (default: {DistillConfig.out})")
    g.add_argument("--resume", metavar="DIR", help="continue the run in DIR (--steps, the intervals and --device "
                                                   "may change; on any number of ranks that divides its global "
                                                   "batch, which is kept)")
    g.add_argument("--overwrite", action="store_true", help="replace a non-empty --out whole")
    g.add_argument("--eval-every", type=count, default=S, help=f"0 = end of each stage only (default: {D.eval_every})")
    g.add_argument("--eval-batches", type=int_or("all"), default=S, help=f"(default: {D.eval_batches})")
    g.add_argument("--log-every", type=positive_int, default=S, help=f"(default: {D.log_every})")
    g.add_argument("--save-every", type=count, default=S, help=f"0 = end of each stage only (default: {D.save_every})")
    g.add_argument("--keep", type=positive_int, default=S, help=f"checkpoints kept (default: {D.keep})")
    add_log_flag(g, default=S, help="also send every metrics record to TensorBoard or W&B; repeatable")
    add_device_flag(g, default=S)
    g.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return p


def _resume_command() -> str:
    """The command that continues an interrupted run: hybrid-distill, or its torchrun form."""
    import os

    from ..parallel.device import env_int

    world, local = env_int("WORLD_SIZE", 1), os.environ.get("LOCAL_WORLD_SIZE")
    if world > 1 and local == str(world):
        return f"torchrun --nproc-per-node {world} -m hybrid.train.distill"
    if world > 1:
        return "torchrun (the same options) -m hybrid.train.distill"
    return "hybrid-distill"


def _run(args: argparse.Namespace) -> int:
    from ..output.tracking import check_trackers
    from ..distill.run import Distiller

    given = config_from_args(args, model_flags=("window",))  # hybrid-distill's one model flag
    kwargs = dict(verbose=0 if args.quiet else 2)
    if args.quiet:
        import datasets

        datasets.disable_progress_bars()
        kwargs["progress"] = False
    if args.resume:
        if args.overwrite:
            raise ValueError("--overwrite and --resume contradict each other: one starts over, the other continues")
        import os

        if "out" in given and os.path.abspath(given["out"]) != os.path.abspath(args.resume):
            raise ValueError(f"--out {given['out']} and --resume {args.resume} name different run directories")
        model = given.pop("model", None)
        if model:
            raise ValueError("--resume: expected no --window or --set (they define the student), got "
                             + ", ".join(sorted(model)))
        distiller = Distiller.from_checkpoint(args.resume, distiller_kwargs=kwargs, **given)
    else:
        if "teacher" not in given:
            raise ValueError("--teacher: expected the teacher's run directory, got none")
        distiller = Distiller(DistillConfig(**given), overwrite=args.overwrite, **kwargs)
    check_trackers(distiller.config.log)
    try:
        distiller.fit()
    except KeyboardInterrupt:
        from ..loop.checkpoint import latest_checkpoint

        saved = latest_checkpoint(distiller.out)
        at = f"at step {distiller.step}"
        if saved is None:
            raise KeyboardInterrupt(f"{at}, before the first checkpoint: nothing to resume") from None
        raise KeyboardInterrupt(f"{at}; the checkpoint of step {saved[0]} survived in {saved[1]}; resume with: "
                                f"{_resume_command()} --resume {shlex.quote(str(distiller.out))}") from None
    return 0


def main(argv: list[str] | None = None) -> int:
    """``hybrid-distill``: returns the exit status."""
    return run_command(parser(), argv, _run)
