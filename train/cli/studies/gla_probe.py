"""``python -m hybrid.train.cli.studies.gla_probe``: how a parity run's G layer holds and flips, and what its read-out
at the last token is made of.

The study's code is ``hybrid.train.tasks.gla_probe``; this is its command line."""
from __future__ import annotations

import sys

from ...tasks.gla_probe import GLA_PROBE_COLUMNS, gla_probe_run
from ..parts import Parser, positive_int, run_command


def main(argv=None) -> int:
    """``python -m hybrid.train.cli.studies.gla_probe RUN [RUN …] [--length 256]``: a markdown table, one row per
    parity run directory."""
    from ...suite import markdown_table

    p = Parser(prog="python -m hybrid.train.cli.studies.gla_probe",
               description="What a parity run's G layer does along its test sequences: its carrier pair's angles "
                           "and decays, and the anchor, the other writes and the other pairs in its read-out")
    p.add_argument("runs", nargs="+", help="parity run directories whose model has a G layer "
                                           "(hybrid-synthetic --task parity --model vo-gla-… --out RUN)")
    p.add_argument("--length", type=positive_int, default=256, help="test length (default 256)")

    def probe(args) -> int:
        print(markdown_table(GLA_PROBE_COLUMNS, [gla_probe_run(run, args.length) for run in args.runs]))
        return 0

    return run_command(p, argv, probe)


if __name__ == "__main__":
    sys.exit(main())
