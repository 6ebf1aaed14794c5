"""Bits per byte by context length inside documents for trained runs, grouped over seeds:
``python -m hybrid.train.bench.context_compare [NAME=]RUN[,RUN …] … --window W --seq-len L [--blocks 128]``.

The same measurement as ``hybrid-bench``'s ``window_bpb`` (``window_gain.window_metrics``: ``blocks`` validation
blocks of ``L`` tokens with no document start inside them, buckets at the window's quarters, then doubling from
the window to L), at any window, for runs trained anywhere. It answers the sizing question for a window the runs
were not benchmarked at: a global Transformer's runs measured once, against windowed runs of several windows.

Output: one markdown row per group (mean ± std over its runs per bucket), then each later group minus the
first (difference of the means).
"""
from __future__ import annotations

__all__ = ["parse_groups", "group_rows", "main"]


def parse_groups(items: list[str]) -> dict[str, list[str]]:
    """``["glob=a,b", "c"]`` → ``{"glob": ["a", "b"], "c": ["c"]}``: a group of runs (its seeds) per argument."""
    groups: dict[str, list[str]] = {}
    for item in items:
        name, _, runs = item.partition("=") if "=" in item else (item, "", item)
        paths = [r for r in runs.split(",") if r]
        if not name or not paths:
            raise ValueError(f"runs: expected NAME=RUN[,RUN…] or RUN, got {item!r}")
        if name in groups:
            raise ValueError(f"runs: expected distinct group names, got {name!r} twice")
        groups[name] = paths
    return groups


def group_rows(figures: dict[str, list[list[float]]]) -> tuple[list[list[str]], list[list[str]]]:
    """From ``{group: [per-run list of per-bucket bpb]}``: the mean ± std rows and the minus-the-first rows."""
    from ..suite import mean_std
    from .window_gain import bucket_rows

    n = len(next(iter(figures.values()))[0])
    means = {g: [mean_std([run[i] for run in runs])[0] for i in range(n)] for g, runs in figures.items()}
    rows = bucket_rows(figures)
    first, base = next(iter(means.items()))
    diffs = [[f"{g} − {first}"] + [f"{m[i] - base[i]:+.3f}" for i in range(n)] for g, m in list(means.items())[1:]]
    return rows, diffs


def main(argv=None) -> int:
    from ..cli.parts import Parser, add_device_flag, positive_int, run_command
    from ..parallel.device import resolve_device
    from ..lm.inference import load_run
    from ..suite import markdown_table

    p = Parser(prog="python -m hybrid.train.bench.context_compare",
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

        from ..data import prepare_data
        from .window_gain import bucket_head, window_edges, window_metrics

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
    raise SystemExit(main())
