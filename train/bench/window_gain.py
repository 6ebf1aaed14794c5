"""Past the window: loss by context length inside documents, and the share of global attention's gain a model recovers.

    seqs = document_blocks(data.valid, eos=data.tokenizer.eos_id, length=L, count=64)   # (64, L + 1)
    edges = window_edges(window=64, seq_len=L)            # [0, 16, 32, 64, 128, 256, 512, 1024]
    bpb = bucket_bpb(model, data, seqs, edges)            # one figure per bucket [edges[i], edges[i+1])

The blocks are cut from the validation stream where no document starts inside them (their first token may be
the ``eos`` that opens a document), so the target at position ``p`` is predicted from exactly ``p + 1`` tokens
of its own document, in either packing. Buckets double from the window on: inside the window every model sees
the whole context; past it the windowed model sees ``window`` tokens at every position, the global model all of
them, and a hybrid what its recurrence carries.

``gain_share(model, windowed, global_)`` per bucket is ``(windowed − model) / (windowed − global)``: 0 where the
model does no better than the windowed Transformer, 1 where it matches the global one (Samba's and Griffin's
question, asked of our hybrids). Where the global model's gain is within the seeds' spread the share is
undefined (None): there is nothing to recover. The report asks it twice: of the bpb itself, and net of each
model's bpb in the last bucket inside the window, where every model sees the same tokens, so that a model
which learnt less in the budget (a gap inside the window as large as past it) is not read as one that used
less context.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..data import PreparedData
from ..suite import fmt_mean_std, markdown_table, mean_std, plot_lines
from .quality import token_losses
from .token_bytes import bits_per_byte, target_bytes

__all__ = ["document_blocks", "window_edges", "bucket_bpb", "window_metrics", "gain_share", "gain_section",
           "bucket_head", "bucket_rows", "GLOBAL", "WINDOWED"]

GLOBAL, WINDOWED = "transformer", "transformer-window"  # the baselines suite's two reference models


def document_blocks(stream: np.ndarray, *, eos: int, length: int, count: int) -> torch.Tensor:
    """Up to ``count`` blocks of ``length + 1`` tokens at stride ``length`` with no ``eos`` after their first token,
    spread evenly over those the stream holds: ``(n, length + 1)`` int64, ``n = min(count, available)``."""
    stream = np.asarray(stream)
    n_blocks = (len(stream) - 1) // length
    if n_blocks < 1:
        raise ValueError(f"length: expected at most {len(stream) - 1} tokens per block, got {length}")
    rows = np.arange(n_blocks)[:, None] * length + np.arange(length + 1)  # (n_blocks, length + 1)
    inside = ~(stream[rows[:, 1:]] == eos).any(axis=1)  # no document starts after the first token
    usable = np.flatnonzero(inside)
    if len(usable) == 0:
        raise ValueError(f"length: no stretch of {length} tokens in the validation stream lies inside one document")
    pick = usable[np.unique(np.linspace(0, len(usable) - 1, min(count, len(usable))).round().astype(int))]
    return torch.from_numpy(stream[rows[pick]].astype(np.int64))


def window_edges(window: int, seq_len: int) -> list[int]:
    """Bucket edges over ``[0, seq_len)``: ``[0, w/4)``, ``[w/4, w/2)``, ``[w/2, w)`` inside the window ``w``, then
    doubling from the window to ``seq_len``. The window must be shorter than ``seq_len``: a window of ``seq_len`` or
    more has nothing past it (its model is global)."""
    if not 0 < window < seq_len:
        raise ValueError(f"window: expected 1 … {seq_len - 1} tokens (fewer than the length {seq_len}), "
                         f"got {window}")
    edges = sorted({0, *(window * q // 4 for q in (1, 2) if window * q // 4 > 0)})  # below the window, so below L
    edge = window
    while edge < seq_len:
        edges.append(edge)
        edge *= 2
    return edges + [seq_len]


def bucket_bpb(model: torch.nn.Module, data: PreparedData, seqs: torch.Tensor, edges: list[int],
               batch_size: int = 8) -> list[float | None]:
    """Bits per byte of the full-context (parallel) losses of ``seqs`` ``(N, T + 1)`` in each bucket of ``edges``:
    each bucket's summed loss over the bytes of its own target tokens (``token_bytes.bits_per_byte``; None for a
    bucket of specials only)."""
    was_training = model.training
    model.eval()
    try:
        losses = token_losses(model, seqs, batch_size=batch_size)  # (N, T)
    finally:
        model.train(was_training)
    nbytes = target_bytes(data.tokenizer, seqs)
    return [bits_per_byte(losses[:, a:b], nbytes[:, a:b]) for a, b in zip(edges[:-1], edges[1:])]


def window_metrics(model, data: PreparedData, *, window: int, seq_len: int, count: int) -> dict:
    """``window_edges``, ``window_bpb`` (bucket_bpb over ``count`` document blocks of ``seq_len``) and
    ``window_blocks`` (how many blocks were read)."""
    seqs = document_blocks(data.valid, eos=data.tokenizer.eos_id, length=seq_len, count=count)
    edges = window_edges(window, seq_len)
    return {"window_edges": edges, "window_bpb": bucket_bpb(model, data, seqs, edges),
            "window_blocks": int(seqs.shape[0])}


def gain_share(model: float, windowed: float, global_: float, *, spread: float = 0.0) -> float | None:
    """``(windowed − model) / (windowed − global_)``; None where the global gain is not above ``spread`` (or
    ``spread`` is NaN: unknown)."""
    gain = windowed - global_
    if not gain > spread:
        return None
    return (windowed - model) / gain


# ---------------------------------------------------------------------------------------------- report

def bucket_head(edges: list[int]) -> list[str]:
    """Column titles ``"[a, b)"`` of the buckets of ``edges``."""
    return [f"[{a}, {b})" for a, b in zip(edges[:-1], edges[1:])]


def bucket_rows(per: dict[str, list[list[float]]]) -> list[list[str]]:
    """One markdown row per name of ``{name: [per-run list of per-bucket bpb]}``: mean ± std over its runs per bucket."""
    return [[name] + [fmt_mean_std(list(bucket)) for bucket in zip(*runs)] for name, runs in per.items()]


def _per_bucket(runs: list[dict]) -> list[list[float]]:
    """Each run's ``window_bpb`` list (runs without it left out)."""
    return [r["metrics"]["window_bpb"] for r in runs if r["metrics"].get("window_bpb")]


def _gain_rows(per: dict[str, list[list[float]]], columns: int, one_seed: bool
               ) -> tuple[list[float], list[str], list[bool], list[list[str]]]:
    """From every model's per-seed values of ``columns`` columns: the global model's gain over the windowed one per
    column, its cell (with twice the larger of their seed spreads, or "one seed"), whether it is above that spread,
    and one row of shares per other model. With ``one_seed`` (of either reference model) a positive gain's shares
    are shown in parentheses: its spread is unknown."""
    stats = {m: [mean_std([v[i] for v in vals]) for i in range(columns)] for m, vals in per.items()}
    gains, cells, above, spreads = [], [], [], []
    for i in range(columns):
        (g, gs), (w, ws) = stats[GLOBAL][i], stats[WINDOWED][i]
        spread = float("nan") if one_seed else 2 * max(gs, ws)  # one seed: no spread
        spreads.append(spread)
        gains.append(w - g)
        above.append(w - g > spread)
        cells.append(f"{w - g:+.3f} (" + ("one seed: no spread" if one_seed else
                                          f"{'above' if w - g > spread else 'not above'} {spread:.3f}") + ")")
    share_rows = []
    for m, vals in per.items():
        if m in (GLOBAL, WINDOWED):
            continue
        row = [m]
        for i in range(columns):
            w, g = stats[WINDOWED][i][0], stats[GLOBAL][i][0]
            unchecked = one_seed and w - g > 0
            shares = [gain_share(v[i], w, g, spread=0.0 if unchecked else spreads[i]) for v in vals]
            cell = "–" if any(s is None for s in shares) else fmt_mean_std(shares, 2)
            row.append(f"({cell})" if unchecked else cell)
        share_rows.append(row)
    return gains, cells, above, share_rows


def _verdict(gains: list[float], above: list[bool], one_seed: bool) -> str:
    """How many of the buckets' gains are above twice the spread; with one seed, how many are positive."""
    if one_seed:
        positive = sum(g > 0 for g in gains)
        return f"the gain is positive in {positive} of {len(gains)} buckets (one seed: no spread to hold it against)"
    return f"the gain is above twice the spread in {sum(above)} of {len(gains)} buckets"


def _net_of_reference(vals: list[list[float]], ref: int, past: list[int]) -> list[list[float]]:
    """Each seed's bpb in the buckets ``past`` less its own bpb in bucket ``ref``."""
    return [[v[i] - v[ref] for i in past] for v in vals]


def gain_section(groups: dict[str, list[dict]], directory: Path | None = None) -> list[str]:
    """The "past the window" section of a bench report: bpb by context length inside documents for every model,
    the global model's gain over the windowed one (and whether it is above twice the seeds' spread), each other
    model's share of it, the same net of the gap in the last bucket inside the window (where every model sees the
    same context), and a plot. Empty when the records have no ``window_bpb``."""
    first = next((r for runs in groups.values() for r in runs if r["metrics"].get("window_edges")), None)
    if first is None:
        return []
    edges = first["metrics"]["window_edges"]
    window = first["config"]["budget"]["extra"]["window"]
    buckets = list(zip(edges[:-1], edges[1:]))
    head = bucket_head(edges)
    per = {m: vals for m, vals in ((m, _per_bucket(runs)) for m, runs in groups.items()) if vals}
    stats = {m: [mean_std([v[i] for v in vals]) for i in range(len(buckets))] for m, vals in per.items()}
    rows = bucket_rows(per)
    lines = ["## Past the window: bpb by context length inside documents\n",
             f"{first['metrics']['window_blocks']} validation blocks of {first['config']['train']['seq_len']} tokens, "
             f"each inside one document, so position p is predicted from p + 1 tokens of its own document. Buckets "
             f"of positions; the windowed models see {window} tokens past the first {window} positions. Mean ± "
             "std over seeds.\n", markdown_table(["model"] + head, rows)]
    out = ["\n".join(lines)]
    past = [i for i, (a, _) in enumerate(buckets) if a >= window]
    if GLOBAL in stats and WINDOWED in stats:
        one_seed = min(len(per[GLOBAL]), len(per[WINDOWED])) < 2
        gains, cells, above, share_rows = _gain_rows(per, len(buckets), one_seed)
        verdict = _verdict([gains[i] for i in past], [above[i] for i in past], one_seed)
        text = ["### The global model's gain, and each model's share of it\n",
                f"Gain = windowed − global bpb per bucket, beside twice the larger of their seed spreads (std). "
                f"Past the window {verdict}. Share = (windowed − "
                "model) / (windowed − global): 0 is no better than the windowed Transformer, 1 is as good as the "
                "global one; – where the gain is not above twice the spread (in parentheses where one seed leaves "
                "the spread unknown). A share per seed of the model, against the reference models' means.\n",
                markdown_table(["", *head], [["gain", *cells]] + share_rows)]
        out.append("\n".join(text))
        ref = max(i for i, (_, b) in enumerate(buckets) if b <= window)
        if past:
            net = {m: _net_of_reference(vals, ref, past) for m, vals in per.items()}
            gains, cells, above, share_rows = _gain_rows(net, len(past), one_seed)
            text = [f"### Net of the gap inside the window (from {head[ref]} on)\n",
                    f"Inside the window every model sees the same context, so a gap there is how well a model learnt, "
                    f"not how much context it used. Here each model's bpb in a bucket past the window is taken less "
                    f"its own bpb in {head[ref]}: the gain is then how much more the global model improves from "
                    f"{head[ref]} to that bucket than the windowed one (its use of the tokens past the window), and "
                    f"a share is the part of that a model recovers. Past the window {_verdict(gains, above, one_seed)}."
                    "\n",
                    markdown_table(["", *[head[i] for i in past]], [["net gain", *cells]] + share_rows)]
            out.append("\n".join(text))
    if directory is not None:
        mids = [math.sqrt(max(a, 1) * b) for a, b in buckets]
        series = {m: (mids, [s[0] for s in stats[m]], [s[1] if math.isfinite(s[1]) else 0.0 for s in stats[m]])
                  for m in stats}
        plot_lines(Path(directory) / "bpb_by_context.png", series, xlabel="context length inside the block (tokens)",
                   ylabel="bits per byte", title=f"bpb by context length (window {window})", logx=True)
        out.append("![bpb by context length](bpb_by_context.png)")
    return out
