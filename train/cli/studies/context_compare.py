"""``python -m hybrid.train.cli.studies.context_compare``: bpb by context length of several runs, side by side.

The study's code is ``hybrid.train.bench.context_compare``; this is its command line."""
from __future__ import annotations

import sys

from ...bench.context_compare import group_rows, parse_groups
from ..flags import add_device_flag
from ..parts import Parser, positive_int, run_command


def main(argv=None) -> int:
    from ...parallel.device import resolve_device
    from ...lm.inference import load_run
    from ...suite import markdown_table

    p = Parser(prog="python -m hybrid.train.cli.studies.context_compare",
               description="bpb by context length inside documents (hybrid-bench's window_bpb) for trained runs, "
                           "at any window; mean ± std over each group's runs")
    p.add_argument("runs", nargs="+", metavar="[NAME=]RUN[,RUN…]",
                   help="run directories, a comma-separated group (its seeds) per argument")
    p.add_argument("--window", type=positive_int, required=True, help="the window whose buckets to use")
    p.add_argument("--seq-len", type=positive_int, required=True, help="the block length L (the training length)")
    p.add_argument("--blocks", type=positive_int, default=128, help="validation blocks (default 128)")
    p.add_argument("--data", default=None, metavar="PATH_OR_DATASET",
                   help="the corpus the runs trained on (default: this Python's stdlib sources)")
    p.add_argument("--tokenizer", default=None, metavar="PATH", help="a tokenizer.json (default: bytes)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    add_device_flag(p)

    def compare(args) -> int:
        import torch

        from ...data import prepare_data
        from ...bench.window_gain import bucket_head, window_edges, window_metrics

        if args.threads is not None:
            torch.set_num_threads(args.threads)
        if args.window >= args.seq_len:
            raise ValueError(f"--window: expected fewer tokens than --seq-len ({args.seq_len}), got {args.window}")
        groups = parse_groups(args.runs)
        device = resolve_device(args.device)
        data = prepare_data(args.data, tokenizer=args.tokenizer)
        figures, blocks = {}, None
        for name, runs in groups.items():
            figures[name] = []
            for run in runs:
                m = window_metrics(load_run(run, device).model, data, window=args.window, seq_len=args.seq_len,
                                   count=args.blocks)
                figures[name].append(m["window_bpb"])
                blocks = m["window_blocks"]
        head = bucket_head(window_edges(args.window, args.seq_len))
        rows, diffs = group_rows(figures)
        print(f"bpb by context length inside documents: {blocks} validation blocks of {args.seq_len} tokens, "
              f"window {args.window}, mean ± std over each group's runs\n")
        print(markdown_table(["runs", *head], rows))
        if diffs:
            print()
            print(markdown_table(["difference of means", *head], diffs))
        return 0

    return run_command(p, argv, compare)


if __name__ == "__main__":
    sys.exit(main())
