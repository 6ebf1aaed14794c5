"""``python -m hybrid.train.cli.studies.gla_probe``: how a parity run's G layer holds and flips, and what its read-out
at the last token is made of; with ``--passkey``, how much of a passkey run's G read-out at the query is the key.

The study's code is ``hybrid.train.tasks.gla_probe``; this is its command line."""
from __future__ import annotations

import sys

from ...tasks.gla_probe import GLA_PROBE_COLUMNS, PASSKEY_PROBE_COLUMNS, gla_passkey_rows, gla_probe_run
from ..parts import Parser, finite_float, positive_int, run_command


def main(argv=None) -> int:
    """``python -m hybrid.train.cli.studies.gla_probe RUN [RUN …] [--length 256]``: a markdown table, one row per
    parity run directory; ``--passkey [--lengths 1024,2048,4096] [--depth 0.5]``: passkey runs, a row per length,
    layer and head."""
    from ...suite import markdown_table, parse_int_list

    p = Parser(prog="python -m hybrid.train.cli.studies.gla_probe",
               description="What a parity run's G layer does along its test sequences: its carrier pair's angles "
                           "and decays, and the anchor, the other writes and the other pairs in its read-out")
    p.add_argument("runs", nargs="+", help="parity run directories whose model has a G layer "
                                           "(hybrid-synthetic --task parity --model vo-gla-… --out RUN)")
    p.add_argument("--length", type=positive_int, default=256, help="parity: the test length (default 256)")
    p.add_argument("--passkey", action="store_true", help="the runs are passkey runs: split each G head's read-out "
                                                           "at the query into the key's writes and the rest")
    p.add_argument("--lengths", default="1024,2048,4096", help="passkey: the sequence lengths (default 1024,2048,4096)")
    p.add_argument("--depth", type=finite_float(0.0, high=1.0), default=0.5,
                   help="passkey: where the key sits, 0 … 1 (default 0.5)")

    def probe(args) -> int:
        if args.passkey:
            lengths = parse_int_list(args.lengths, "--lengths", "1024,2048")
            rows = [row for run in args.runs for row in gla_passkey_rows(run, lengths, args.depth)]
            print(markdown_table(PASSKEY_PROBE_COLUMNS, rows))
            return 0
        print(markdown_table(GLA_PROBE_COLUMNS, [gla_probe_run(run, args.length) for run in args.runs]))
        return 0

    return run_command(p, argv, probe)


if __name__ == "__main__":
    sys.exit(main())
