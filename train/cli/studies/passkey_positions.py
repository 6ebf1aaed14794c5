"""``python -m hybrid.train.cli.studies.passkey_positions``: a passkey run's accuracy by the key's position.

The study's code is ``hybrid.train.tasks.passkey.positions``; this is its command line."""
from __future__ import annotations

import sys

from ...tasks.passkey.positions import SAMPLES, score_positions
from ..flags import add_device_flag
from ..parts import Parser, positive_int, run_command


def main(argv=None) -> int:
    """``python -m hybrid.train.cli.studies.passkey_positions RUN [RUN …] --length N``: a markdown table."""
    from ...parallel.device import resolve_device
    from ...suite import markdown_table, parse_int_list
    from ...tasks.passkey.reach import check_passkey_run
    from ...tasks.train import load_task_run

    p = Parser(prog="python -m hybrid.train.cli.studies.passkey_positions",
               description="A passkey run's exact match and per-digit accuracy by the key's exact position at one "
                           "length, on fresh sequences")
    p.add_argument("runs", nargs="+", help="passkey run directories (hybrid-synthetic --task passkey --out RUN)")
    p.add_argument("--length", type=positive_int, required=True, help="the sequence length to test")
    p.add_argument("--positions", help="comma-separated key positions, negative ones from the end (-1: the key "
                                       "right before the query); default: 0 … k, the middle, F − k … F")
    p.add_argument("--samples", type=positive_int, default=SAMPLES,
                   help=f"sequences per position (default {SAMPLES})")
    p.add_argument("--seed", type=int, help="the sequences' seed (default: the task's test_seed + 1)")
    p.add_argument("--yarn", action="store_true", help="read the length with YaRN (factor length / training length)")
    add_device_flag(p)

    def positions_table(args) -> int:
        wanted = None if args.positions is None else parse_int_list(args.positions, "--positions", "0,1,-1")
        device = resolve_device(args.device)
        rows, head = [], None
        for run in args.runs:
            check_passkey_run(run)
            model, task = load_task_run(run, device)
            if args.length < 2 * task.k + 2:
                raise ValueError(f"--length: expected at least {2 * task.k + 2} (2·key_digits + 2), got {args.length}")
            scored = score_positions(model, task, args.length, wanted, samples=args.samples, seed=args.seed,
                                     rope_scaling="yarn" if args.yarn else None, device=device)
            cols = [f"p {r['position']} (d {r['distance']})" for r in scored]
            if head is not None and cols != head[2:]:
                raise ValueError(f"runs: expected passkey runs with the same key length, got {run} with "
                                 f"key_digits={task.k}")
            head = head or ["run", ""] + cols
            name = f"{run} (YaRN)" if args.yarn else str(run)
            rows += [[name, key] + [f"{r[key]:.3f}" for r in scored] for key in ("exact", "digit")]
        print(f"length {args.length}, {args.samples} sequences per position; p: key-marker position, d: tokens from "
              "the key's last digit to the query")
        print(markdown_table(head, rows))
        return 0

    return run_command(p, argv, positions_table)


if __name__ == "__main__":
    sys.exit(main())
