"""Long-context training cost: tokens/s and peak memory of each preset against the sequence length.

    python -m hybrid.train.bench.long_context                          # CPU, T = 1K, 2K, 4K, 8K, 16K, B=1
    python -m hybrid.train.bench.long_context --lengths 1024,8192 --presets hybrid,transformer
    python -m hybrid.train.bench.long_context --device cuda --out table.md
    python -m hybrid.train.bench.long_context --lengths 8192 --presets transformer,hybrid,hybrid:linear,transformer:all

A preset written ``name:MODE`` trains with ``HybridConfig.recompute = MODE`` (activation checkpointing:
``linear`` recomputes the blocks whose mixer is O(T), ``all`` every block) and is its own row.

One training step is forward + backward of the cross-entropy loss. Every (preset, T) cell runs in a process
of its own, so its peak memory is that cell's alone: the peak resident set size of the process on CPU
(``ru_maxrss``, which includes the interpreter and torch, about 0.3 GB), ``torch.cuda.max_memory_allocated``
on CUDA. tokens/s is B·T over the median of ``--reps`` steps after one warm-up step.

Every preset has the same width and depth (d_model 256, 4 layers, 4 heads, byte vocabulary); the hybrid
preset's attention layers use ``--window``. The cost of every preset except the global transformer should
grow linearly in T: its tokens/s stays flat and its memory grows in proportion.
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.models.config import RECOMPUTE

PRESET_NAMES = ("transformer", "hybrid", "retnet", "vo-rnn", "vo-gla")
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 16384)


def split_row(row: str) -> tuple[str, str]:
    """``"hybrid:linear"`` -> ``("hybrid", "linear")``; a bare preset recomputes nothing."""
    preset, _, recompute = row.partition(":")
    return preset, recompute or "none"


def build(row: str, d_model: int, n_layers: int, n_heads: int, window: int, dtype: str) -> HybridLM:
    preset, recompute = split_row(row)
    extra = {"window": window} if preset == "hybrid" else {}
    config = HybridConfig.preset(preset, "tiny", d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                 dtype=dtype, recompute=recompute, **extra)
    torch.manual_seed(0)
    return HybridLM(config)


def measure_cell(args) -> dict:
    """Runs in the child process: one (preset, T) cell."""
    device = torch.device(args.device)
    model = build(args.preset, args.d_model, args.n_layers, args.n_heads, args.window, args.dtype).to(device)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len), device=device)

    def step():
        logits, _ = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    seconds = statistics.median(times)
    return {"preset": args.preset, "seq_len": args.seq_len, "layers": model.config.layer_types,
            "params": model.num_parameters(exclude_embeddings=True),
            "tokens_per_s": args.batch * args.seq_len / seconds,
            "spread": (min(times) / seconds, max(times) / seconds), "peak_bytes": peak}


def run_cell(args, preset: str, seq_len: int) -> dict:
    cmd = [sys.executable, "-m", "hybrid.train.bench.long_context", "--cell", "--preset", preset,
           "--seq-len", str(seq_len)] + [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                                         ("device", "dtype", "batch", "d_model", "n_layers", "n_heads", "window",
                                          "reps")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"preset": preset, "seq_len": seq_len, "error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"


def table(args, cells: dict) -> list[str]:
    lengths = args.lengths
    memory = "peak RSS" if args.device == "cpu" else "peak allocated"
    lines = [
        f"Training forward+backward, B={args.batch}, d_model {args.d_model}, {args.n_layers} layers, "
        f"{args.n_heads} heads, hybrid window {args.window}, {args.dtype}, on {describe(torch.device(args.device))}; "
        f"median of {args.reps} steps; each cell in its own process",
        "",
        "| preset | layers | " + " | ".join(f"T={t} tok/s" for t in lengths) + " | "
        + " | ".join(f"{memory} T={t}" for t in lengths) + " |",
        "|---|---|" + "---:|" * (2 * len(lengths)),
    ]
    for preset in args.presets:
        row = [cells[preset, t] for t in lengths]
        layers = next((c["layers"] for c in row if "layers" in c), "?")
        speed = [f"{c['tokens_per_s']:,.0f}" if "error" not in c else "failed" for c in row]
        mem = [f"{c['peak_bytes'] / 2**30:.2f} GiB" if "error" not in c else "failed" for c in row]
        lines.append(f"| {preset} | {layers} | " + " | ".join(speed) + " | " + " | ".join(mem) + " |")
    errors = [f"- {p} at T={t}: {c['error']}" for (p, t), c in cells.items() if "error" in c]
    return lines + ([""] + errors if errors else [])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="parameter dtype (default float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--presets", default=",".join(PRESET_NAMES))
    p.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    p.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--preset", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seq-len", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("long_context: --device cuda asked for but no CUDA device is visible")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.cell:
        print(json.dumps(measure_cell(args)))
        return
    args.presets = [s for s in args.presets.split(",") if s]
    unknown = sorted(row for row, (preset, recompute) in ((r, split_row(r)) for r in args.presets)
                     if preset not in PRESET_NAMES or recompute not in RECOMPUTE)
    if unknown:
        raise SystemExit(f"presets: expected names from {list(PRESET_NAMES)}, each optionally with "
                         f":MODE for MODE in {RECOMPUTE[1:]}, got {unknown}")
    args.lengths = [int(t) for t in args.lengths.split(",")]
    cells = {}
    for preset in args.presets:
        for seq_len in args.lengths:
            cells[preset, seq_len] = cell = run_cell(args, preset, seq_len)
            done = f"{cell['tokens_per_s']:,.0f} tok/s, {cell['peak_bytes'] / 2**30:.2f} GiB" if "error" not in cell \
                else f"failed: {cell['error']}"
            print(f"  {preset:12s} T={seq_len:6d}  {done}", file=sys.stderr, flush=True)
    lines = table(args, cells)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
