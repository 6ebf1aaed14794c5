"""Bits per byte by context length inside documents for trained runs, grouped over seeds:
``python -m hybrid.train.cli.studies.context_compare [NAME=]RUN[,RUN …] … --window W --seq-len L [--blocks 128]``.

The same measurement as ``hybrid-bench``'s ``window_bpb`` (``window_gain.window_metrics``: ``blocks`` validation
blocks of ``L`` tokens with no document start inside them, buckets ``[0, W/4)``, ``[W/4, W/2)``, ``[W/2, W)``,
then doubling from the window to L), at any window, for runs trained anywhere. It answers the sizing question for
a window the runs were not benchmarked at: a global Transformer's runs measured once, against windowed runs of
several windows.

Output: one markdown row per group (mean ± std over its runs per bucket), then each later group minus the
first (difference of the means).
"""
from __future__ import annotations

__all__ = ["parse_groups", "group_rows"]


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
