"""GPU benchmark of the complex scan: Triton kernels vs the torch backend vs a plain device copy.

    python -m hybrid.train.bench.scan_gpu [--out docs/bench_complex_scan.md] [--skip-torch] [--quick]

First checks the Triton backend against the float64 sequential reference on the GPU for one moderate shape
(forward and all four gradients; prints the max errors, exits 1 when they are off), then times with
``triton.testing.do_bench`` (median):

* Triton forward (inference path: no checkpoints) and forward+backward (autograd: checkpoints saved, then
  the backward kernel for all four gradients),
* the torch backend (``hybrid.kernels.complex_scan.blocked.complex_scan_torch``) the same way,
* ``torch.empty_like(x).copy_(x)``: the device's copy bandwidth on the same bytes.

Bytes counted per row are what the op must minimally move:
  forward:  read x, log_decay, theta (their real sizes: a static (1, 1, H, P) decay costs nothing),
            write y and the final state;
  backward: read x, dy, log_decay, theta, the checkpoints (fp32 state every 64 steps), write dx,
            dlog_decay, dtheta;
  forward+backward: the forward (plus writing the checkpoints) and the backward.
GB/s = bytes / time; "% copy" compares with the copy's GB/s (bytes read + written) on the same device.

Without CUDA it prints "no CUDA device; nothing measured" and exits 0.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from hybrid.kernels.complex_scan import complex_scan
from hybrid.kernels.complex_scan.blocked import complex_scan_torch
from hybrid.kernels.complex_scan.reference import complex_scan_reference

MAIN_SHAPE = (8, 8192, 16, 128)
CK_INTERVAL = 64  # checkpoint spacing used for the byte count (the tuned kernel may pick 32–128)


# ----------------------------------------------------------------------------------------------------------
# Inputs and byte counts
# ----------------------------------------------------------------------------------------------------------
def triton_op(x, log_decay, theta, initial_state):
    """The Triton scan as the model runs it: ``complex_scan``'s custom op (its one autograd path)."""
    return complex_scan(x, log_decay, theta, initial_state, output_final_state=True, backend="triton",
                        check_values=False)


def make_inputs(B, T, H, D, dtype, mode, device, seed=0, requires_grad=False):
    """mode: 'dep' (B, T, H, P) decay and angle, 'static' (1, 1, H, P) both, 'mixed' static decay and
    data-dependent angle. Inputs are already in the normalised (Bd, Td, H, P) float32 form."""
    g = torch.Generator(device=device).manual_seed(seed)
    P = D // 2
    x = torch.randn(B, T, H, D, generator=g, device=device).to(dtype)
    ld_shape = (B, T, H, P) if mode == "dep" else (1, 1, H, P)
    th_shape = (1, 1, H, P) if mode == "static" else (B, T, H, P)
    ld = -0.5 * torch.rand(ld_shape, generator=g, device=device) - 1e-3
    th = torch.randn(th_shape, generator=g, device=device)
    if requires_grad:
        for t in (x, ld, th):
            t.requires_grad_()
    return x, ld, th


def bytes_moved(x, ld, th, pass_):
    B, T, H, D = x.shape
    xb = x.numel() * x.element_size()
    decay = (ld.numel() + th.numel()) * 4
    final = B * H * D * 4
    ck = B * H * D * 4 * math.ceil(T / CK_INTERVAL)
    fwd = xb + decay + xb + final
    bwd = xb + xb + decay + ck + xb + decay  # x, dy, ld/θ, checkpoints in; dx, dld/dθ out
    if pass_ == "fwd":
        return fwd
    return fwd + ck + bwd


# ----------------------------------------------------------------------------------------------------------
# Correctness on the GPU
# ----------------------------------------------------------------------------------------------------------
def check_correctness(device, shape=(2, 777, 4, 64)) -> bool:
    ref = complex_scan_reference
    ok = True
    B, T, H, D = shape
    print(f"correctness vs the float64 sequential reference (B={B}, T={T}, H={H}, D={D}; "
          "max |err| / max |ref|):")
    for dtype, mode, tol_y in [(torch.float32, "dep", 1e-4), (torch.float32, "mixed", 1e-4),
                               (torch.bfloat16, "dep", 1e-2)]:
        x, ld, th = make_inputs(B, T, H, D, dtype, mode, device, seed=1)
        s0 = torch.randn(B, H, D, device=device)
        leaves = [x.clone().requires_grad_(), ld.clone().requires_grad_(), th.clone().requires_grad_(),
                  s0.clone().requires_grad_()]
        y, f = triton_op(*leaves)
        gy = torch.randn_like(y)
        gf = torch.randn_like(f)
        got = torch.autograd.grad((y.float() * gy.float()).sum() + (f * gf).sum(), leaves)
        rl = [v.detach().double().requires_grad_() for v in leaves]
        yr, fr = ref(*rl, output_final_state=True)
        want = torch.autograd.grad((yr * gy.double()).sum() + (fr * gf.double()).sum(), rl)
        parts = {"y": (y, yr), "final": (f, fr)}
        parts.update({f"d{n}": (a, b) for n, a, b in zip(["x", "log_decay", "theta", "init"], got, want)})
        line = []
        for name, (a, b) in parts.items():
            err = (a.double() - b.double()).abs().max().item()
            scale = b.abs().max().item()
            rel = err / max(scale, 1e-30)
            # Low-precision y/dx carry one output rounding; the fp32 states/gradients are fp32-accurate.
            tol = tol_y if name in ("y", "dx") else 1e-4
            if not math.isfinite(rel) or rel > tol:
                ok = False
            line.append(f"{name} {rel:.1e}")
        print(f"  {str(dtype).replace('torch.', ''):8s} {mode:6s}: " + ", ".join(line))
    x, ld, th = make_inputs(B, T, H, D, torch.float32, "dep", device, seed=2)
    y_t, f_t = triton_op(x, ld, th, None)
    y_c, f_c = complex_scan_torch(x, ld, th, None)
    print(f"  triton vs torch backend (fp32, dep): max |y diff| {(y_t - y_c).abs().max().item():.2e}, "
          f"max |final diff| {(f_t - f_c).abs().max().item():.2e}")
    print("  ->", "OK" if ok else "MISMATCH")
    return ok


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------
def _bench(fn):
    import triton.testing

    fn()  # compile / autotune outside the timed region
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")


def _fwd_fn(impl, x, ld, th):
    def fn():
        with torch.no_grad():
            return impl(x, ld, th, None)
    return fn


def _fwd_bwd_fn(impl, x, ld, th, gy):
    leaves = (x, ld, th)

    def fn():
        y, _ = impl(x, ld, th, None)
        return torch.autograd.grad(y, leaves, gy)
    return fn


def run_cases(cases, skip_torch, device="cuda"):
    from hybrid.kernels.complex_scan import triton_scan

    torch_impl = None if skip_torch else complex_scan_torch
    rows, notes = [], ["torch backend skipped (--skip-torch)"] if skip_torch else []
    copy_gbs = {}
    for (B, T, H, D), dtype, mode in cases:
        shape = f"{B}x{T}x{H}x{D}"
        dname = str(dtype).replace("torch.", "")
        try:
            x, ld, th = make_inputs(B, T, H, D, dtype, mode, device, requires_grad=True)
            gy = torch.randn_like(x)
        except torch.cuda.OutOfMemoryError:
            notes.append(f"{shape} {dname} {mode}: out of memory allocating inputs")
            continue

        key = (shape, dname)
        if key not in copy_gbs:
            xd = x.detach()
            ms = _bench(lambda: torch.empty_like(xd).copy_(xd))
            nbytes = 2 * xd.numel() * xd.element_size()
            copy_gbs[key] = nbytes / ms / 1e6
            rows.append((shape, dname, "-", "copy", "copy", ms, nbytes, copy_gbs[key], 100.0))

        impls = [("triton", triton_op)]
        if torch_impl is not None:
            impls.append(("torch", torch_impl))
        for name, impl in impls:
            for pass_, fn in [("fwd", _fwd_fn(impl, x.detach(), ld.detach(), th.detach())),
                              ("fwd+bwd", _fwd_bwd_fn(impl, x, ld, th, gy))]:
                try:
                    ms = _bench(fn)
                except torch.cuda.OutOfMemoryError:
                    notes.append(f"{shape} {dname} {mode} {name} {pass_}: out of memory")
                    torch.cuda.empty_cache()
                    continue
                nbytes = bytes_moved(x, ld, th, pass_)
                gbs = nbytes / ms / 1e6
                rows.append((shape, dname, mode, name, pass_, ms, nbytes, gbs, 100.0 * gbs / copy_gbs[key]))
                if name == "triton" and getattr(triton_scan, "_AUTOTUNE", False):
                    tuned = triton_scan._TUNED.get((triton_scan._LAYOUT, "fwd" if pass_ == "fwd" else "bwd",
                                                    triton_scan._STAGES if triton_scan._LAYOUT == "runs" else 1))
                    cfg = getattr(tuned, "best_config", None)
                    if cfg is not None:
                        notes.append(f"{shape} {dname} {mode} {'backward' if pass_ != 'fwd' else 'forward'} "
                                     f"config: {cfg}")
        del x, ld, th, gy
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows, notes


def format_table(rows, notes, header):
    lines = [header, "",
             "| shape BxTxHxD | dtype | decay/angle | impl | pass | ms | MB moved | GB/s | % copy |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for shape, dtype, mode, impl, pass_, ms, nbytes, gbs, pct in rows:
        lines.append(f"| {shape} | {dtype} | {mode} | {impl} | {pass_} | {ms:.3f} | {nbytes / 1e6:.1f} | "
                     f"{gbs:.0f} | {pct:.0f}% |")
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", help="also write the markdown table to this path")
    parser.add_argument("--skip-torch", action="store_true", help="do not time the torch backend")
    parser.add_argument("--quick", action="store_true", help="only the main shape in bf16 (dep)")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("no CUDA device; nothing measured")
        return 0

    import triton

    from hybrid.kernels.complex_scan import triton_scan

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    header = (f"complex_scan on {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, "
              f"triton {triton.__version__}, autotune {'on' if triton_scan._AUTOTUNE else 'off'}; "
              f"median of triton.testing.do_bench; mode dep = (B,T,H,P) decay and angle, static = (1,1,H,P), "
              f"mixed = static decay + (B,T,H,P) angle.")
    print(header)
    if not check_correctness(device):
        print("correctness check failed; not timing")
        return 1

    bf16, fp32 = torch.bfloat16, torch.float32
    B, T, H, D = MAIN_SHAPE
    if args.quick:
        cases = [(MAIN_SHAPE, bf16, "dep")]
    else:
        cases = [(MAIN_SHAPE, bf16, "dep"), (MAIN_SHAPE, bf16, "mixed"), (MAIN_SHAPE, bf16, "static"),
                 (MAIN_SHAPE, fp32, "dep"),
                 ((B, 2048, H, D), bf16, "dep"), ((B, 32768, H, D), bf16, "dep"), ((B, T, H, 64), bf16, "dep")]
    t0 = time.time()
    rows, notes = run_cases(cases, args.skip_torch)
    notes.append(f"wall time {time.time() - t0:.0f} s (includes compilation and autotuning)")
    table = format_table(rows, notes, header)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(table)
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
