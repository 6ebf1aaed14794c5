"""Decoding cost of several trained runs side by side: ``python -m hybrid.train.cli.studies.decode_compare RUN … [--context
16384] [--tokens 32] [--repeats 3]``.

Each repeat measures every run once, in turn (``cost.decode_cost``: a chunked prefill of ``context`` random tokens,
then ``tokens`` greedy steps), so a load that changes during the measurement touches every run alike. The table gives
each run's median ms/token with its min–max over the repeats, the ratio of medians to the first run, and the
decoding state's bytes after the context (constant for windows and recurrences, growing for a KV cache).
"""
from __future__ import annotations

import statistics

from .cost import decode_cost

__all__ = ["compare_decoding"]


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
