"""``hybrid-distill``: turn a trained Transformer run (ours, or one written by hybrid-import) into a hybrid.

User errors print one line and exit 2 (``hybrid.train.cli.lm``'s conventions); a diverged run exits 1, an
interrupted one 130 with the command that continues it. ``python -m hybrid.train.cli.distill`` is the same command, and
``torchrun --nproc-per-node N -m hybrid.train.cli.distill …`` runs it on N ranks (``hybrid.train.distill.run``).
"""
from __future__ import annotations

import argparse
import shlex
import sys

from ..distill.config import STUDENT, DistillConfig
from .flags import (absolute_inputs, add_config_flags, add_model_flags, add_run_flags, add_threads_flag,
                    config_from_args)
from .parts import Parser, run_command

__all__ = ["main", "parser"]

EPILOG = """\
examples:
  hybrid-distill --teacher runs/tf --pattern RRA --window 64 --out runs/tf-rra
  hybrid-distill --teacher runs/llama --keep-attention auto:2 --out runs/llama-hybrid
  hybrid-distill --resume runs/tf-rra --steps 400          # continue; --steps is stage 2's new total
  torchrun --nproc-per-node 4 -m hybrid.train.cli.distill --teacher runs/tf --pattern RRA --batch-size 4 \\
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
    # every DistillConfig option (the shared sections, the teacher and student, the stages); one left out keeps its
    # default, or on --resume its saved value
    groups = add_config_flags(p, DistillConfig)
    add_model_flags(groups[STUDENT], ("window",),
                    set_help="an option of the new R layers, e.g. --set rnn_selective=true or --set "
                             "recurrence.rotary_dim=2 (recurrence.* fields or their rnn_* names, recompute)")
    add_run_flags(groups["loop"], resume="continue the run in DIR (--steps, the intervals and --device may change, "
                                         "and --teacher if it moved; on any number of ranks)",
                  overwrite="replace a non-empty --out whole")
    add_threads_flag(groups["execution"], default=argparse.SUPPRESS)
    return p


def _resume_command() -> str:
    """The command that continues an interrupted run: hybrid-distill, or its torchrun form."""
    import os

    from ..parallel.device import env_int

    world, local = env_int("WORLD_SIZE", 1), os.environ.get("LOCAL_WORLD_SIZE")
    if world > 1 and local == str(world):
        return f"torchrun --nproc-per-node {world} -m hybrid.train.cli.distill"
    if world > 1:
        return "torchrun (the same options) -m hybrid.train.cli.distill"
    return "hybrid-distill"


def _run(args: argparse.Namespace) -> int:
    from ..output.tracking import check_trackers
    from ..distill.run import Distiller
    from ..loop.checkpoint import run_dir_of

    given = absolute_inputs(config_from_args(args, model_flags=("window",)))  # hybrid-distill's one model flag
    kwargs = dict(verbose=0 if args.quiet else 2)
    if args.quiet:
        import datasets

        datasets.disable_progress_bars()
        kwargs["progress"] = False
    if args.resume:
        if args.overwrite:
            raise ValueError("--overwrite and --resume contradict each other: one starts over, the other continues")
        import os

        if "out" in given and os.path.abspath(given["out"]) != os.path.abspath(run_dir_of(args.resume)):
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


if __name__ == "__main__":
    sys.exit(main())
