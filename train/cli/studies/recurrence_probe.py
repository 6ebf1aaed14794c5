"""``python -m hybrid.train.cli.studies.recurrence_probe``: how exactly a parity run's recurrence flips and holds.

The study's code is ``hybrid.train.tasks.recurrence_probe``; this is its command line."""
from __future__ import annotations

import sys

from ...tasks.recurrence_probe import PROBE_COLUMNS, probe_run
from ..parts import Parser, positive_int, run_command


def main(argv=None) -> int:
    """``python -m hybrid.train.cli.studies.recurrence_probe RUN [RUN …] [--length 256]``: a markdown table, one row per
    parity run directory."""
    from ...suite import markdown_table

    p = Parser(prog="python -m hybrid.train.cli.studies.recurrence_probe",
               description="What a parity run's recurrence does along its test sequences: its carrier pair's "
                           "angles and decays against parity's automaton, and its accuracy with the angles rounded")
    p.add_argument("runs", nargs="+", help="parity run directories (hybrid-synthetic --task parity --out RUN)")
    p.add_argument("--length", type=positive_int, default=256, help="test length (default 256)")

    def probe(args) -> int:
        print(markdown_table(PROBE_COLUMNS, [probe_run(run, args.length) for run in args.runs]))
        return 0

    return run_command(p, argv, probe)


if __name__ == "__main__":
    sys.exit(main())
