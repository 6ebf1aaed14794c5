"""The comparisons behind the correctness part, shared with the CUDA tests (tests/cuda): each runs one fast path
on a device against its float64 reference with fresh random inputs and returns the relative errors
(‖got − want‖ / ‖want‖) of the outputs and of every gradient.

Tolerances (``TOLERANCE``) follow the arithmetic: float32 paths are float32-accurate; a bfloat16 / float16
output (y, and the gradient of x, which has x's dtype) carries one rounding to that dtype (to nearest: at most
2^-8 / 2^-11 relative), while states, decay / angle gradients and final states stay in float32. Triton's CPU
interpreter truncates to bfloat16 instead of rounding, which doubles that bound (``truncating``).
"""
from __future__ import annotations

import math

import torch

from .context import rel_error

__all__ = ["TOLERANCE", "scan_errors", "scan_case", "triton_scan_run", "cuda_test_cases", "short_case",
           "packed_edge_case", "SPLIT_CASES", "SPLIT_PIECES", "split_case_errors", "windows_as_rows_errors",
           "packed_offsets", "window_errors", "conv_errors", "tolerance_for"]

# relative error allowed for (dtype, quantity): "out" = y or a gradient in the input's dtype, "fp32" = the rest
TOLERANCE = {
    (torch.float32, "out"): 2e-5, (torch.float32, "fp32"): 2e-5,
    (torch.bfloat16, "out"): 2.0 ** -8, (torch.bfloat16, "fp32"): 1e-4,
    (torch.float16, "out"): 2.0 ** -11, (torch.float16, "fp32"): 1e-4,
}
_IN_X_DTYPE = ("y", "grad x")


def tolerance_for(dtype: torch.dtype, name: str, truncating: bool = False) -> float:
    """The tolerance of quantity ``name``; ``truncating``: the Triton interpreter's bfloat16 stores."""
    low = name in _IN_X_DTYPE
    return TOLERANCE[(dtype, "out" if low else "fp32")] * (2 if truncating and low and dtype == torch.bfloat16 else 1)


def packed_offsets(T: int, edge: int, generator: torch.Generator) -> torch.Tensor:
    """cu_seqlens over T tokens with documents of length 1 and 2 first, cuts at, one before and one after
    multiples of ``edge`` (the kernel's time tile) and a few random cuts."""
    cuts = {1, 3}
    for m in range(edge, T, edge):
        cuts |= {m - 1, m, m + 1}
    cuts |= set(torch.randint(1, max(T, 2), (4,), generator=generator).tolist())
    return torch.tensor([0] + sorted(c for c in cuts if 0 < c < T) + [T])


def _scan_inputs(B, T, H, D, dtype, mode, device, seed, n_states):
    g = torch.Generator().manual_seed(seed)
    P = D // 2
    dep = (B, T, H, P)
    x = torch.randn(B, T, H, D, generator=g).to(dtype)
    ld = -(1e-3 + 0.5 * torch.rand(dep if mode == "dependent" else (H, P), generator=g))
    th = math.pi * (2 * torch.rand((H, P) if mode == "static" else dep, generator=g) - 1)
    s0 = torch.randn(n_states, H, D, generator=g)
    up_y = torch.randn(B, T, H, D, generator=g).to(dtype)
    up_f = torch.randn(n_states, H, D, generator=g)
    return [t.to(device) for t in (x, ld, th, s0)], (up_y.to(device), up_f.to(device))


def _scan_run(leaves, ups, cu, backend, dtype):
    from hybrid.kernels import complex_scan

    ts = [t.detach().to(dtype if i == 0 else (torch.float64 if dtype == torch.float64 else torch.float32))
          .requires_grad_() for i, t in enumerate(leaves)]
    y, final = complex_scan(*ts, output_final_state=True, cu_seqlens=cu, backend=backend)
    loss = (y * ups[0].to(y.dtype)).sum() + (final * ups[1].to(final.dtype)).sum()
    grads = torch.autograd.grad(loss, ts)
    return dict(zip(("y", "final", "grad x", "grad log_decay", "grad theta", "grad initial_state"), (y, final, *grads)))


# The scan cases of tests/cuda/test_scan_cuda.py (``pytest -m cuda``, run by the tests part), kept here so
# that ``prewarm`` compiles their kernels too: every dtype × decay mode at short lengths, long and autotuned
# lengths, and packed rows with boundaries at, before and after every time tile.
SHORT_LENGTHS = (1, 2, 63, 65, 1000)
LONG_CASES = [
    (torch.float32, 8192, "dependent", {}),
    (torch.bfloat16, 8192, "dependent", {"B": 4, "H": 4, "D": 64}),  # 2^22 pair-steps: the autotuned kernels
    (torch.float16, 8192, "static", {}),
    (torch.float32, 65536, "dependent", {"B": 1, "H": 2}),
    (torch.bfloat16, 65536, "mixed", {"B": 1, "H": 2}),
]
PACKED_EDGES = (32, 64, 128)
PACKED_MODES = ("dependent", "mixed", "static")
PACKED_AUTOTUNED = (torch.bfloat16, 8192, "dependent", {"packed_edge": 64, "H": 8, "D": 128})
MODES = ("static", "dependent", "mixed")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# a row cut into SPLIT_PIECES pieces by ``time_split`` (as "auto" cuts few long rows on a GPU): fp32 with dependent
# decay, bf16 with mixed
SPLIT_PIECES = 4
SPLIT_CASES = [(torch.float32, SPLIT_PIECES * 63, "dependent", {"B": 1, "H": 2}),
               (torch.bfloat16, SPLIT_PIECES * 63, "mixed", {"B": 1, "H": 2})]


def short_case(dtype, T: int, mode: str) -> tuple:
    """``(dtype, T, mode, scan_errors keywords)`` of a short-length CUDA test."""
    return dtype, T, mode, {"seed": T}


def packed_edge_case(edge: int, mode: str) -> tuple:
    """``(dtype, T, mode, scan_errors keywords)`` of a packed CUDA test with boundaries at a time tile's edge."""
    return torch.float32, 4 * edge + 3, mode, {"packed_edge": edge, "seed": edge}


def cuda_test_cases() -> list[tuple]:
    """``(dtype, T, mode, scan_errors keywords)`` of every scan case of the CUDA tests that ``scan_errors`` runs as
    it is, in their order (``SPLIT_CASES`` run it inside ``time_split``)."""
    cases = [short_case(dtype, T, mode) for T in SHORT_LENGTHS for mode in MODES for dtype in DTYPES]
    cases += LONG_CASES
    cases += [packed_edge_case(edge, mode) for mode in PACKED_MODES for edge in PACKED_EDGES]
    return cases + [PACKED_AUTOTUNED]


def split_case_errors(device, case: tuple) -> dict:
    """``scan_errors`` of a ``SPLIT_CASES`` case, its rows cut into ``SPLIT_PIECES`` pieces."""
    from hybrid.kernels.complex_scan.time_split import time_split

    dtype, T, mode, kw = case
    with time_split(SPLIT_PIECES):
        return scan_errors(device, dtype, T, mode, **kw)


def windows_as_rows_errors(device) -> dict:
    """The trainer's packed batch (three windows of 100, each starting a document, with documents inside)
    scanned by ``complex_scan(backend="triton")`` in float32 as a row per window (``PackedOffsets.row_len``):
    relative errors of y and the gradients of x, log_decay and theta against each sequence run alone in float64."""
    from hybrid.kernels import complex_scan, complex_scan_reference
    from hybrid.kernels.varlen import PackedOffsets

    bounds = [0, 40, 77, 100, 163, 200, 300]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 300, 2, 32, generator=g, dtype=torch.float64)
    ld = -(0.01 + 0.3 * torch.rand(1, 300, 2, 16, generator=g, dtype=torch.float64))
    th = torch.randn(1, 300, 2, 16, generator=g, dtype=torch.float64)
    up = torch.randn(1, 300, 2, 32, generator=g, dtype=torch.float64)
    offsets = PackedOffsets.from_bounds(bounds, device=device)
    if offsets.row_len != 100:
        raise AssertionError(f"windows_as_rows_errors: expected windows of 100, got row_len {offsets.row_len}")

    def run(fn, dtype, device):
        leaves = [t.to(device, dtype).requires_grad_() for t in (x, ld, th)]
        y = fn(*leaves)
        return [y, *torch.autograd.grad((y * up.to(device, y.dtype)).sum(), leaves)]
    ours = run(lambda *a: complex_scan(*a, cu_seqlens=offsets, backend="triton")[0], torch.float32, device)
    ref = run(lambda *a: complex_scan_reference(*a, cu_seqlens=torch.tensor(bounds))[0], torch.float64, "cpu")
    names = ("y", "grad x", "grad log_decay", "grad theta")
    return {n: rel_error(a, b) for n, a, b in zip(names, ours, ref)}


def scan_case(device, dtype, T, mode, *, B=2, H=3, D=32, packed_edge: int | None = None, seed=0):
    """The inputs of one ``scan_errors`` case: ``(leaves, upstream gradients, cu_seqlens or None)``."""
    cu = None
    if packed_edge is not None:
        B = 1
        cu = packed_offsets(T, packed_edge, torch.Generator().manual_seed(seed + 1)).to(device)
    n_states = B if cu is None else cu.numel() - 1
    leaves, ups = _scan_inputs(B, T, H, D, dtype, mode, device, seed, n_states)
    return leaves, ups, cu


def triton_scan_run(leaves, ups, cu, dtype) -> dict:
    """``complex_scan(backend="triton")`` on a ``scan_case``: its outputs and the gradients of every leaf."""
    return _scan_run(leaves, ups, cu, "triton", dtype)


def scan_errors(device, dtype, T, mode, *, B=2, H=3, D=32, packed_edge: int | None = None, seed=0) -> dict:
    """Relative errors of ``complex_scan(backend="triton")`` on ``device`` against float64: the sequential
    reference up to 4096 steps, the blocked torch backend in float64 beyond (itself checked against the
    reference in tests/kernels). ``packed_edge``: one packed row (B = 1) with boundaries around multiples of it.
    mode: "static" ((H, P) decay and angle), "dependent" ((B, T, H, P) both) or "mixed" (static decay,
    dependent angle)."""
    leaves, ups, cu = scan_case(device, dtype, T, mode, B=B, H=H, D=D, packed_edge=packed_edge, seed=seed)
    ours = triton_scan_run(leaves, ups, cu, dtype)
    ref_backend = "reference" if T <= 4096 else "torch"
    ref = _scan_run([t.double() for t in leaves], ups, cu, ref_backend, torch.float64)
    return {name: rel_error(ours[name], ref[name]) for name in ours}


def window_errors(device, dtype, backend, T, window, *, B=2, H=4, G=2, D=64, packed=False, seed=0) -> dict:
    """Relative errors of ``window_attention(backend=...)`` (output and the gradients of q, k, v) against the
    dense float64 reference. G: key/value heads (grouped-query attention when G < H)."""
    from hybrid.kernels import window_attention

    g = torch.Generator().manual_seed(seed)
    cu = None
    if packed:
        B = 1
        cu = packed_offsets(T, 64, g).to(device)
    q = torch.randn(B, T, H, D, generator=g)
    k = torch.randn(B, T, G, D, generator=g)
    v = torch.randn(B, T, G, D, generator=g)
    up = torch.randn(B, T, H, D, generator=g)

    def run(dt, how):
        ts = [t.to(device, dt).requires_grad_() for t in (q, k, v)]
        o = window_attention(*ts, window, backend=how, cu_seqlens=cu)
        grads = torch.autograd.grad((o * up.to(device, o.dtype)).sum(), ts)
        return dict(zip(("out", "grad q", "grad k", "grad v"), (o, *grads)))

    ours, ref = run(dtype, backend), run(torch.float64, "reference")
    # Window 1: each query sees its own key alone, so the reference's grad q and grad k are exactly 0, while a
    # kernel's backward leaves round-off there (two sums that cancel, added in different orders): measured
    # against the largest reference's size, not as a plain norm held to a relative tolerance.
    scale = max(t.detach().double().norm().item() for t in ref.values())
    return {name: rel_error(ours[name], ref[name], zero_scale=scale) for name in ours}


def conv_errors(device, dtype, backend, *, B=2, T=300, C=64, W=4, packed=False, seed=0) -> dict:
    """Relative errors of ``causal_conv1d(backend=...)`` (output, final state and the gradients of x, weight,
    bias and the initial state) against the float64 reference."""
    from hybrid.kernels import causal_conv1d

    g = torch.Generator().manual_seed(seed)
    cu = None
    if packed:
        B = 1
        cu = packed_offsets(T, 64, g).to(device)
    rows = B if cu is None else cu.numel() - 1
    x = torch.randn(B, T, C, generator=g)
    w = torch.randn(C, W, generator=g) / W
    b = torch.randn(C, generator=g)
    s0 = torch.randn(rows, W - 1, C, generator=g)
    up = torch.randn(B, T, C, generator=g)

    def run(dt, how):
        ts = [t.to(device, dt).requires_grad_() for t in (x, w, b, s0)]
        y, final = causal_conv1d(ts[0], ts[1], ts[2], ts[3], output_final_state=True, cu_seqlens=cu, backend=how)
        grads = torch.autograd.grad((y * up.to(device, y.dtype)).sum() + final.sum(), ts)
        return dict(zip(("y", "final", "grad x", "grad weight", "grad bias", "grad initial_state"), (y, final, *grads)))

    ours, ref = run(dtype, backend), run(torch.float64, "reference")
    return {name: rel_error(ours[name], ref[name]) for name in ours}
