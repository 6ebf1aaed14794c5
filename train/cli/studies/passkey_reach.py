"""``python -m hybrid.train.cli.studies.passkey_reach``: a passkey run's accuracy by the key's distance to the query.

The study's code is ``hybrid.train.tasks.passkey.reach``; this is its command line."""
from __future__ import annotations

import sys

from ...tasks.passkey.reach import EDGES, GROUPINGS, run_reach
from ..flags import add_device_flag
from ..parts import Parser, positive_int, run_command


def main(argv=None) -> int:
    """``python -m hybrid.train.cli.studies.passkey_reach RUN [RUN …] [--edges …]``: a markdown table."""
    from ...parallel.device import resolve_device
    from ...suite import markdown_table, parse_int_list

    p = Parser(prog="python -m hybrid.train.cli.studies.passkey_reach",
               description="A passkey run's exact match and per-digit accuracy by the key's distance to the query, "
                           "from its test results")
    p.add_argument("runs", nargs="+", help="passkey run directories (hybrid-synthetic --task passkey --out RUN)")
    p.add_argument("--edges", default=",".join(map(str, EDGES)),
                   help=f"comma-separated bucket bounds in tokens (default {','.join(map(str, EDGES))})")
    p.add_argument("--yarn", action="store_true",
                   help="score each run's model again, reading every length above its training length with YaRN")
    p.add_argument("--by", choices=GROUPINGS, default="distance",
                   help="group the cells by the key's distance to the query (default) or by test length, or show "
                        "every cell (exact match, a row per length)")
    p.add_argument("--samples", type=positive_int,
                   help="score the model again on a fresh grid of this many sequences per cell")
    p.add_argument("--seed", type=int, help="the fresh grid's seed (default: the run's test seed)")
    add_device_flag(p)

    def reach(args) -> int:
        edges = parse_int_list(args.edges, "--edges", "64,256")
        rescored = args.yarn or args.samples is not None or args.seed is not None
        device = resolve_device(args.device) if rescored else "cpu"
        per_run = [(f"{run} (YaRN)" if args.yarn else run,
                    run_reach(run, edges, yarn=args.yarn, device=device, by=args.by, samples=args.samples,
                              seed=args.seed)) for run in args.runs]
        if args.by == "cell":
            print(_cell_table(per_run))
            return 0
        his = {b["label"]: b["hi"] for _, buckets in per_run for b in buckets}
        labels = sorted(his, key=his.get)
        rows = []
        for run, buckets in per_run:
            by = {b["label"]: b for b in buckets}
            for name in ("exact", "digit"):
                rows.append([str(run), name] + [f"{by[x][name]:.3f}" if x in by else "" for x in labels])
            rows.append([str(run), "sequences"] + [str(by[x]["sequences"]) if x in by else "" for x in labels])
        print(markdown_table(["run", args.by] + labels, rows))
        return 0

    return run_command(p, argv, reach)


def _cell_table(per_run) -> str:
    """Exact match per cell: a row per (run, length), a column per depth; the sequences per cell after it."""
    from ...suite import markdown_table

    depths = sorted({c["depth"] for _, cells in per_run for c in cells})
    rows = []
    for run, cells in per_run:
        by = {(c["length"], c["depth"]): c for c in cells}
        for length in sorted({c["length"] for c in cells}):
            rows.append([str(run), str(length)] + [f"{by[length, d]['exact']:.2f}" if (length, d) in by else ""
                                                   for d in depths] + [str(cells[0]["sequences"])])
    return markdown_table(["run", "length"] + [f"{d:.0%}" for d in depths] + ["sequences per cell"], rows)


if __name__ == "__main__":
    sys.exit(main())
