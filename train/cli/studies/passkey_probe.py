"""``python -m hybrid.train.cli.studies.passkey_probe``: what a passkey run's recurrence holds of the key.

The study's code is ``hybrid.train.tasks.passkey.probe``; this is its command line."""
from __future__ import annotations

import sys

from ...tasks.passkey.probe import PROBE_COLUMNS, probe_run
from ..parts import Parser, run_command


def main(argv=None) -> int:
    """``python -m hybrid.train.cli.studies.passkey_probe RUN [RUN …] [--lengths 256,1024]``: a markdown table."""
    from ...suite import markdown_table, parse_int_list

    p = Parser(prog="python -m hybrid.train.cli.studies.passkey_probe",
               description="What a passkey run's recurrence layers hold at the query: the key's share of each "
                           "pair's state, what the decay keeps of it, and how much the filler writes")
    p.add_argument("runs", nargs="+", help="passkey run directories (hybrid-synthetic --task passkey --out RUN)")
    p.add_argument("--lengths", default="256,1024", help="comma-separated test lengths (default 256,1024)")
    p.add_argument("--depth", type=float, default=0.5, help="where the key sits, 0 … 1 (default 0.5)")

    def probe(args) -> int:
        if not 0.0 <= args.depth <= 1.0:
            raise ValueError(f"--depth: expected a number in [0, 1], got {args.depth}")
        lengths = parse_int_list(args.lengths, "--lengths", "256,1024")
        print(markdown_table(PROBE_COLUMNS, [row for run in args.runs for row in probe_run(run, lengths, depth=args.depth)]))
        return 0

    return run_command(p, argv, probe)


if __name__ == "__main__":
    sys.exit(main())
