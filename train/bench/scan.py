"""Benchmark of complex_scan: backend × size, forward and forward+backward, against a copy of the same bytes.

    python -m hybrid.train.bench.scan                    # CPU: cpu and torch backends vs a per-step loop
    python -m hybrid.train.bench.scan --load             # the same while a second process runs matmuls
    python -m hybrid.train.bench.scan --out table.md     # also write the markdown table
    python -m hybrid.train.bench.scan --device cuda      # GPU: runs hybrid.train.bench.scan_gpu (Triton vs torch vs copy, do_bench)

Bytes counted are the minimum a pass must move: forward reads x (+ decays/angles when data-dependent)
and writes y; backward reads x, y, dy (+ decays/angles) and writes dx (+ their gradients). "copy GB/s" is
the bandwidth of ``torch.clone`` on a tensor of that size on the same device (allocation included, as the
op allocates its output); "% copy" is achieved / copy bandwidth; "vs loop" is the per-step loop's forward
time over the backend's (the ratio the CPU targets are stated in: ≥ 5× quiet, ≥ 3× under ``--load``).

``--load`` starts a competing process first: torch matmuls on 2 threads, without pause, the way a data
worker or a second job shares the machine; it is stopped when the table is done.
"""
from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import subprocess
import sys
import time

import torch

from hybrid.kernels import complex_scan
from hybrid.kernels.complex_scan import resolve_backend

CPU_SHAPES = [(4, 4096, 8, 64), (2, 1024, 8, 64), (1, 16384, 4, 128)]


def timer(reps: int):
    """f ↦ median milliseconds of ``reps`` calls, after one warm-up call."""

    def measure(fn):
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    return measure


def per_step_loop(x, log_decay, theta):
    """The baseline: the recurrence written as a Python loop over time (what the scan replaces)."""
    B, T, H, D = x.shape
    P = D // 2
    xc = torch.view_as_complex(x.float().reshape(B, T, H, P, 2))
    a = torch.exp(torch.complex(log_decay.float(), -theta.float())).expand(B, T, H, P)
    s = torch.zeros(B, H, P, dtype=torch.complex64, device=x.device)
    y = torch.empty(B, T, H, P, dtype=torch.complex64, device=x.device)
    for t in range(T):
        s = a[:, t] * s + xc[:, t]
        y[:, t] = s
    return torch.view_as_real(y).reshape(B, T, H, D).to(x.dtype)


def make_inputs(shape, dtype, dependent, device, gen):
    B, T, H, D = shape
    P = D // 2
    dshape = (B, T, H, P) if dependent else (H, P)
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    log_decay = (-0.2 * torch.rand(dshape, generator=gen)).to(device)
    theta = torch.rand(dshape, generator=gen).to(device)
    return x, log_decay, theta


def pass_bytes(shape, dtype, dependent, backward):
    B, T, H, D = shape
    elt = torch.tensor([], dtype=dtype).element_size()
    act = B * T * H * D * elt
    decay = 2 * B * T * H * (D // 2) * 4 if dependent else 0
    fwd = 2 * act + decay
    return fwd + (4 * act + 2 * decay if backward else 0)


def copy_bandwidth(nbytes, device, measure):
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    ms = measure(lambda: buf.clone())
    return 2 * buf.numel() * 4 / (ms * 1e-3) / 1e9


# The competing process of --load: 2-thread matmuls until killed; prints "ready" once running.
_LOAD_SCRIPT = """
import torch
torch.set_num_threads(2)
a = torch.randn(768, 768)
b = torch.randn(768, 768)
a @ b
print("ready", flush=True)
while True:
    a @ b
"""


@contextlib.contextmanager
def competing_load(enabled: bool):
    """Run the --load process for the duration of the block (nothing when not ``enabled``)."""
    if not enabled:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", _LOAD_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()  # wait until it computes
        yield proc
    finally:
        proc.kill()
        proc.wait()


def run(device: torch.device, shapes, dtypes, backends, reps: int, with_loop: bool):
    gen = torch.Generator().manual_seed(0)
    measure = timer(reps)
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            for dependent in (False, True):
                x, ld, th = make_inputs(shape, dtype, dependent, device, gen)
                copy_gbs = copy_bandwidth(pass_bytes(shape, dtype, dependent, False), device, measure)
                candidates = [(b, lambda b=b: complex_scan(x, ld, th, backend=b)) for b in backends]
                if with_loop:
                    candidates.append(("per-step loop", lambda: per_step_loop(x, ld, th)))
                for name, fwd in candidates:
                    fwd_ms = measure(fwd)
                    row = dict(backend=name, shape=shape, dtype=str(dtype).replace("torch.", ""),
                               decay="dependent" if dependent else "static", fwd_ms=fwd_ms,
                               fwd_gbs=pass_bytes(shape, dtype, dependent, False) / (fwd_ms * 1e-3) / 1e9,
                               copy_gbs=copy_gbs, fb_ms=None, fb_gbs=None)
                    if name != "per-step loop":
                        xg, ldg, thg = (t.clone().requires_grad_() for t in (x, ld, th))
                        dy = torch.randn_like(x)

                        def fwd_bwd():
                            y, _ = complex_scan(xg, ldg, thg, backend=name)
                            torch.autograd.grad(y, (xg, ldg, thg), dy)

                        row["fb_ms"] = measure(fwd_bwd)
                        row["fb_gbs"] = pass_bytes(shape, dtype, dependent, True) / (row["fb_ms"] * 1e-3) / 1e9
                    rows.append(row)
    return rows


def to_markdown(rows, loop_speedup=True):
    lines = [
        "| backend | B×T×H×D | dtype | decay/angle | fwd ms | fwd GB/s | fwd+bwd ms | fwd+bwd GB/s | copy GB/s | fwd % copy | fwd+bwd % copy | vs loop |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    loops = {(r["shape"], r["dtype"], r["decay"]): r["fwd_ms"] for r in rows if r["backend"] == "per-step loop"}
    for r in rows:
        key = (r["shape"], r["dtype"], r["decay"])
        speedup = f"{loops[key] / r['fwd_ms']:.1f}×" if key in loops and loop_speedup else "–"
        fb = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
        fb_pct = "–" if r["fb_gbs"] is None else f"{100 * r['fb_gbs'] / r['copy_gbs']:.0f}%"
        lines.append(
            f"| {r['backend']} | {'×'.join(map(str, r['shape']))} | {r['dtype']} | {r['decay']} | "
            f"{r['fwd_ms']:.2f} | {r['fwd_gbs']:.1f} | {fb(r['fb_ms'], '.2f')} | {fb(r['fb_gbs'], '.1f')} | "
            f"{r['copy_gbs']:.1f} | {100 * r['fwd_gbs'] / r['copy_gbs']:.0f}% | "
            f"{fb_pct} | {speedup} |"
        )
    return "\n".join(lines)


def describe() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--device", default="cpu", help="cpu, or cuda to run hybrid.train.bench.scan_gpu")
    p.add_argument("--shape", action="append", default=None, metavar="B,T,H,D",
                   help="a size to run (repeatable); default: " + " ".join(",".join(map(str, s)) for s in CPU_SHAPES))
    p.add_argument("--dtype", action="append", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--reps", type=int, default=5, help="repetitions (median reported)")
    p.add_argument("--no-loop", action="store_true", help="skip the per-step loop baseline")
    p.add_argument("--load", action="store_true",
                   help="run the table beside a second process doing 2-thread matmuls (CPU only)")
    p.add_argument("--out", default=None, help="also write the markdown table here")
    args, rest = p.parse_known_args(argv)
    if args.device.startswith("cuda"):
        from hybrid.train.bench import scan_gpu as bench_gpu

        raise SystemExit(bench_gpu.main(rest + (["--out", args.out] if args.out else [])))
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape] if args.shape else CPU_SHAPES
    dtypes = [getattr(torch, d) for d in (args.dtype or ["float32"])]
    backends = ["cpu", "torch"] if resolve_backend(None, torch.device(args.device)) == "cpu" else ["torch"]
    with competing_load(args.load):
        rows = run(torch.device(args.device), shapes, dtypes, backends, args.reps, not args.no_loop)
    load = "; beside a second process running 2-thread matmuls (--load)" if args.load else ""
    table = f"complex_scan on {describe()}{load}\n\n" + to_markdown(rows)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
