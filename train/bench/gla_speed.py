"""The G mixer's cost on the CPU against R and retention (issue 46): training tokens/s and peak memory at T = 2K and
8K, decoding ms/token and state bytes after a 16K-token prompt, at one width and depth.

    flock /tmp/hybrid-bench.lock python -m hybrid.train.bench.gla_speed --rounds 3 --out docs/research/gla/speed.md

Every preset has d_model 256, 4 layers, 4 heads (head size 64: G's state is 64 × 64 per head, as retention's) and
the byte vocabulary. Training: ``long_context``'s cells (one process each, forward + backward, B = 1, median of
``--reps`` steps). Decoding: ``cost.decode_cost`` (a chunked prefill of the prompt, then one token at a time;
state bytes as ``HybridState.nbytes``). The presets run in turn within each of ``--rounds`` rounds, so that the
ratios G / R and G / M are measured side by side; the table gives their median and range over the rounds.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
from types import SimpleNamespace

import torch

from hybrid.models import HybridConfig, HybridLM

from .cost import decode_cost
from .long_context import run_cell

PRESETS = ("vo-gla", "vo-rnn", "retnet")
SHAPE = dict(d_model=256, n_layers=4, n_heads=4)


def decode_cell(preset: str, context: int, tokens: int) -> dict:
    torch.manual_seed(0)
    model = HybridLM(HybridConfig.preset(preset, "tiny", **SHAPE))
    with torch.no_grad():
        return decode_cost(model, context=context, new_tokens=tokens)


def _range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="2048,8192")
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--tokens", type=int, default=32, help="decoded tokens timed per cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    lengths = [int(t) for t in args.lengths.split(",")]
    cell_args = SimpleNamespace(device="cpu", dtype="float32", batch=1, window=256, reps=args.reps, **SHAPE)
    train = {(pr, t): [] for pr in PRESETS for t in lengths}
    decode = {pr: [] for pr in PRESETS}
    for r in range(args.rounds):
        for preset in PRESETS:
            for t in lengths:
                cell = run_cell(cell_args, preset, t)
                if "error" in cell:
                    raise SystemExit(f"gla_speed: {preset} at T={t} failed: {cell['error']}")
                train[preset, t].append(cell)
                print(f"round {r} {preset} T={t}: {cell['tokens_per_s']:,.0f} tok/s, "
                      f"{cell['peak_bytes'] / 2**30:.2f} GB", file=sys.stderr, flush=True)
            decode[preset].append(decode_cell(preset, args.context, args.tokens))
            print(f"round {r} {preset} decode: {decode[preset][-1]['ms_per_token']:.2f} ms/token", file=sys.stderr,
                  flush=True)
    lines = [f"CPU ({platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads), d_model 256, "
             f"4 layers, 4 heads, float32, B = 1; median (min–max) over {args.rounds} rounds; training: median of "
             f"{args.reps} steps per cell, each cell in its own process; decoding: {args.tokens} tokens after a "
             f"{args.context}-token chunked prefill.", ""]
    head = ["preset", "non-emb. params"] + [f"tok/s T={t}" for t in lengths] + [f"peak RSS GB T={t}" for t in lengths] \
        + [f"decode ms/token @{args.context}", "state bytes"]
    rows = []
    for preset in PRESETS:
        rows.append([preset, f"{train[preset, lengths[0]][0]['params']:,}"]
                    + [_range([c["tokens_per_s"] for c in train[preset, t]]) for t in lengths]
                    + [_range([c["peak_bytes"] / 2**30 for c in train[preset, t]]) for t in lengths]
                    + [_range([d["ms_per_token"] for d in decode[preset]]), f"{decode[preset][0]['state_bytes']:,}"])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "Ratios per round, G over R and G over retention (M):", ""]
    ratio_head = ["ratio"] + [f"tok/s T={t}" for t in lengths] + ["decode ms/token"]
    ratio_rows = []
    for other in ("vo-rnn", "retnet"):
        cells = [_range([a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(train["vo-gla", t], train[other, t])])
                 for t in lengths]
        cells.append(_range([a["ms_per_token"] / b["ms_per_token"] for a, b in zip(decode["vo-gla"], decode[other])]))
        ratio_rows.append([f"G / {other}"] + cells)
    lines += ["| " + " | ".join(ratio_head) + " |", "|" + "---|" * len(ratio_head)]
    lines += ["| " + " | ".join(r) + " |" for r in ratio_rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
