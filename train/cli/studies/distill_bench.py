"""``python -m hybrid.train.cli.studies.distill_bench``: the distillation measurement's evaluations and table.

The study's code is ``hybrid.train.distill.bench``; this is its command line."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

DESCRIPTION = ('The distillation measurement (docs/research/distillation.md, "Distillation"): evaluate run '
               'directories, then tabulate them.')


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.cli.studies.distill_bench", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("eval", help="evaluate run directories (writes RUN/eval.json)")
    e.add_argument("runs", nargs="+")
    e.add_argument("--seq-len", type=int, default=256)
    e.add_argument("--context", type=int, default=16384)
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--data", default=None)
    t = sub.add_parser("table", help="markdown table of evaluated runs: LABEL=RUN[,RUN...]")
    t.add_argument("groups", nargs="+")
    t.add_argument("--context", type=int, default=16384)
    args = p.parse_args(argv)
    import torch

    from ...distill.bench import evaluate_run, table

    if args.command == "eval":
        torch.set_num_threads(args.threads)
        for run in args.runs:
            print(json.dumps(evaluate_run(run, seq_len=args.seq_len, context=args.context, data=args.data)), flush=True)
    else:
        groups = []
        for g in args.groups:
            label, _, runs = g.partition("=")
            groups.append((label, [Path(r) for r in runs.split(",")]))
        print(table(groups, args.context))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
