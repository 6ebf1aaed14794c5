"""``python -m hybrid.train.cli.studies.decode_compare``: decoding cost of several runs at one context.

The study's code is ``hybrid.train.bench.decode_compare``; this is its command line."""
from __future__ import annotations

import sys

from ...bench.decode_compare import compare_decoding, table_rows
from ..flags import add_device_flag
from ..parts import Parser, positive_int, run_command


def main(argv=None) -> int:
    from ...parallel.device import resolve_device
    from ...lm.inference import load_run
    from ...suite import markdown_table

    p = Parser(prog="python -m hybrid.train.cli.studies.decode_compare",
               description="Decoding ms/token and state bytes of trained runs after a long context, measured in turn")
    p.add_argument("runs", nargs="+", help="run directories (hybrid-train, hybrid-bench, hybrid-distill)")
    p.add_argument("--context", type=positive_int, default=16384, help="prompt tokens before decoding (default 16384)")
    p.add_argument("--tokens", type=positive_int, default=32, help="decoded tokens per measurement (default 32)")
    p.add_argument("--repeats", type=positive_int, default=3, help="measurements per run (default 3)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    add_device_flag(p)

    def compare(args) -> int:
        import torch

        if args.threads is not None:
            torch.set_num_threads(args.threads)
        if len(set(args.runs)) != len(args.runs):
            raise ValueError(f"runs: expected distinct run directories, got {args.runs}")
        device = resolve_device(args.device)
        models = {run: load_run(run, device).model for run in args.runs}
        results = compare_decoding(models, context=args.context, tokens=args.tokens, repeats=args.repeats)
        print(f"decoding after {args.context:,} tokens, {args.tokens} tokens per measurement, {args.repeats} "
              f"repeats in turn, {torch.get_num_threads()} threads, {device}:\n")
        print(markdown_table(["run", "ms/token (median)", "min–max", "× first", "state bytes"], table_rows(results)))
        return 0

    return run_command(p, argv, compare)


if __name__ == "__main__":
    sys.exit(main())
