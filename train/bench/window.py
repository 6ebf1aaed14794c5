"""Sliding-window attention layer: training time and peak memory against the sequence length.

    python -m hybrid.train.bench.window                                  # CPU, T = 1K … 16K, window 256
    python -m hybrid.train.bench.window --device cuda --dtype bfloat16   # adds flex / flash rows on a GPU
    python -m hybrid.train.bench.window --lengths 256,512 --reps 1       # a quick check

One `hybrid.Attention` layer (d_model, heads, kv heads, window as given), forward+backward of `y.sum()` on
`(B, T, d_model)`, for each way of attending:

    global       window=None: causal SDPA over all keys (the Transformer layer, for comparison)
    dense-mask   the window as a dense (T, T) band mask handed to SDPA (what the layer did before the
                 block-local form: O(T²) time and memory)
    blocked      hybrid.kernels.window_attention's block-local SDPA, O(T·w) (the CPU default)
    flex, flash  FlexAttention / flash-attn's window (CUDA only; flash with fp16/bf16 and flash-attn installed)

Each row runs in its own subprocess. Peak memory: on CPU the peak RSS of that process above its RSS before the
inputs were made (`ru_maxrss`); on CUDA `torch.cuda.max_memory_allocated`. Rows whose dense (T, T) scores would
exceed `--max-dense-gb` are skipped and say so.
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

WAYS = ("global", "dense-mask", "blocked", "flex", "flash")


def _dense_mask_window_attention(q, k, v, window, *, scale=None, backend=None):
    """The layer's former windowed path: a dense `(T, S)` band mask through SDPA."""
    from hybrid.kernels.window_attention import band_mask, sdpa_bthd

    T, S = q.shape[1], k.shape[1]
    return sdpa_bthd(q, k, v, band_mask(T, S, S - T, window, q.device), scale)


def run_row(way: str, T: int, args) -> dict:
    """Time and peak memory of one (way, T) in this process."""
    import hybrid.attention as attention
    from hybrid import Attention

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if way == "dense-mask":
        attention.window_attention = _dense_mask_window_attention
    backend = way if way in ("blocked", "flex", "flash") else None
    torch.manual_seed(0)
    layer = Attention(args.d_model, args.heads, n_kv_heads=args.kv_heads, placement="qkvo",
                      window=None if way == "global" else args.window, window_backend=backend).to(device, dtype)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    x = torch.randn(args.batch, T, args.d_model, device=device, dtype=dtype, requires_grad=True)

    def step():
        y, _ = layer(x)
        y.float().sum().backward()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()  # warm-up (and compilation for flex)
    sync()
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:  # ru_maxrss is in KiB on Linux, bytes on macOS
        unit = 1 if platform.system() == "Darwin" else 1024
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * unit
    return {"ms": statistics.median(times) * 1e3, "peak_mb": peak / 2**20}


def available(way: str, args) -> str | None:
    """None when the way can run here, else why not."""
    if way in ("flex", "flash") and args.device != "cuda":
        return "CUDA only"
    if way == "flash":
        from hybrid.kernels.window_attention.flash import FLASH_AVAILABLE

        if not FLASH_AVAILABLE or args.dtype not in ("float16", "bfloat16"):
            return "needs flash-attn and fp16/bf16"
    if way == "flex":
        from hybrid.kernels.window_attention.flex import FLEX_AVAILABLE

        if not FLEX_AVAILABLE:
            return "needs torch >= 2.5"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384", help="comma-separated T values")
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-dense-gb", type=float, default=4.0,
                   help="skip dense-mask rows whose (B, H, T, T) float32 scores exceed this")
    p.add_argument("--row", nargs=2, metavar=("WAY", "T"), help=argparse.SUPPRESS)  # one row, in a subprocess
    args = p.parse_args(argv)

    if args.row:
        print(json.dumps(run_row(args.row[0], int(args.row[1]), args)))
        return 0
    try:
        lengths = [int(t) for t in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths: expected comma-separated ints, got {args.lengths!r}")
    ways = args.ways.split(",")
    if any(w not in WAYS for w in ways):
        p.error(f"--ways: expected names from {WAYS}, got {args.ways!r}")

    print(f"Attention layer forward+backward: B={args.batch}, d_model={args.d_model}, heads={args.heads}, "
          f"kv heads={args.kv_heads or args.heads}, window={args.window}, {args.dtype}, {args.device}, "
          f"torch {torch.__version__}, median of {args.reps}")
    print()
    print("| way | T | ms / step | tokens/s | peak MB |")
    print("|---|---:|---:|---:|---:|")
    passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                   if k not in ("row", "lengths", "ways") and v is not None]
    for way in ways:
        for T in lengths:
            why = available(way, args)
            dense_gb = args.batch * args.heads * T * T * 4 / 2**30
            if why is None and way == "dense-mask" and dense_gb > args.max_dense_gb:
                why = f"dense scores {dense_gb:.1f} GB > --max-dense-gb"
            if why is not None:
                print(f"| {way} | {T} | skipped: {why} | | |")
                continue
            done = subprocess.run([sys.executable, "-m", "hybrid.train.bench.window", "--row", way, str(T),
                                   *passthrough], capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {way} | {T} | failed: {last[:120]} | | |")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {way} | {T} | {r['ms']:.1f} | {args.batch * T / r['ms'] * 1e3:,.0f} | {r['peak_mb']:.0f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
