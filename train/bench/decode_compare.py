"""Decoding cost of several trained runs side by side: ``python -m hybrid.train.bench.decode_compare RUN … [--context
16384] [--tokens 32] [--repeats 3]``.

Each repeat measures every run once, in turn (``cost.decode_cost``: a chunked prefill of ``context`` random tokens,
then ``tokens`` greedy steps), so a load that changes during the measurement touches every run alike. The table gives
each run's median ms/token with its min–max over the repeats, the ratio of medians to the first run, and the
decoding state's bytes after the context (constant for windows and recurrences, growing for a KV cache).
"""
from __future__ import annotations

import statistics

from .cost import decode_cost

__all__ = ["compare_decoding", "main"]


def compare_decoding(models: dict, *, context: int, tokens: int, repeats: int) -> dict[str, dict]:
    """``{name: {"ms_per_token": [one per repeat], "state_bytes": int}}`` for ``{name: model}``, interleaved."""
    out = {name: {"ms_per_token": [], "state_bytes": None} for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            cost = decode_cost(model, context=context, new_tokens=tokens)
            out[name]["ms_per_token"].append(cost["ms_per_token"])
            out[name]["state_bytes"] = cost["state_bytes"]
    return out


def table_rows(results: dict[str, dict]) -> list[list[str]]:
    """Markdown rows: run, median ms/token, min–max, ratio to the first run's median, state bytes."""
    first = statistics.median(next(iter(results.values()))["ms_per_token"])
    rows = []
    for name, r in results.items():
        ms = r["ms_per_token"]
        med = statistics.median(ms)
        rows.append([name, f"{med:.2f}", f"{min(ms):.2f}–{max(ms):.2f}", f"{med / first:.2f}",
                     f"{r['state_bytes']:,}"])
    return rows


def main(argv=None) -> int:
    from ..cli.parts import Parser, add_device_flag, positive_int, run_command
    from ..parallel.device import resolve_device
    from ..lm.inference import load_run
    from ..suite import markdown_table

    p = Parser(prog="python -m hybrid.train.bench.decode_compare",
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
    raise SystemExit(main())
