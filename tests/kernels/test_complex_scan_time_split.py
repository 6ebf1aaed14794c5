"""The scan split in time (kernels/complex_scan/time_split.py): few long rows scanned as many short pieces, twice.

Forced with ``time_split(pieces)``: outputs, final states and all four gradients equal the float64 sequential
reference on every backend, static, data-dependent and mixed decay, with and without initial states, packed rows
with documents across the pieces' edges included; a long float32 row keeps the precision of one pass (the
pieces' angles are reduced modulo 2π before rounding); it compiles. ``pieces_for``: when "auto" splits (a Triton
scan on CUDA whose grid fills at most a quarter of the SMs), asked of a stand-in GPU.
"""
from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

from hybrid.kernels import complex_scan, complex_scan_reference
from hybrid.kernels.complex_scan import cpu_scan, time_split as split_module
from hybrid.kernels.complex_scan.interface import triton_available
from hybrid.kernels.complex_scan.time_split import pieces_for, time_split

_seed = itertools.count(1618)
_NEEDS_TRITON = pytest.mark.skipif(
    not triton_available() or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="no triton")
BACKENDS = ["torch", pytest.param("cpu", marks=pytest.mark.skipif(not cpu_scan.available(), reason="no C++")),
            pytest.param("triton", marks=_NEEDS_TRITON)]


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def leaves(B, T, H, D, decay, init, dtype):
    g = gen()
    P = D // 2
    dep = (B, T, H, P)
    x = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    ld = -(0.01 + 0.3 * torch.rand(dep if decay == "dependent" else (H, P), generator=g, dtype=torch.float64))
    th = math.pi * (2 * torch.rand((H, P) if decay == "static" else dep, generator=g, dtype=torch.float64) - 1)
    s0 = torch.randn(B, H, D, generator=g, dtype=torch.float64) if init else None
    ups = torch.randn(B, T, H, D, generator=g, dtype=torch.float64), torch.randn(B, H, D, generator=g,
                                                                                 dtype=torch.float64)
    return [None if t is None else t.to(dtype) for t in (x, ld, th, s0)], ups


def outputs_and_grads(fn, ts, ups):
    ts = [None if t is None else t.detach().clone().requires_grad_() for t in ts]
    y, final = fn(*ts)
    loss = (y.double() * ups[0]).sum() + (final.double() * ups[1]).sum()
    wrt = [t for t in ts if t is not None]
    return (y, final, *torch.autograd.grad(loss, wrt))


def assert_close(ours, ref, tol, what):
    names = ("y", "final", "grad x", "grad log_decay", "grad theta", "grad initial_state")
    for name, got, want in zip(names, ours, ref):
        assert got.shape == want.shape, f"{what} {name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        err = (got.double() - want.double()).abs().max().item() / max(want.abs().max().item(), 1e-30)
        assert err < tol, f"{what} {name}: relative error {err:.2e}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("decay", ["static", "dependent", "mixed"])
@pytest.mark.parametrize("init", [False, True], ids=["zero0", "init"])
def test_pieces_equal_the_reference(backend, decay, init, one_torch_thread):
    triton = backend == "triton"
    B, T, H, D, pieces = (1, 36, 2, 6, 4) if triton else (2, 52, 3, 10, 4)  # pieces of 9 and 13 steps
    dtype = torch.float32 if triton else torch.float64
    ts, ups = leaves(B, T, H, D, decay, init, dtype)

    def split(x, ld, th, s0):
        with time_split(pieces):
            return complex_scan(x, ld, th, s0, output_final_state=True, backend=backend)
    ours = outputs_and_grads(split, ts, ups)
    ref = outputs_and_grads(lambda *a: complex_scan_reference(*a, output_final_state=True),
                            [None if t is None else t.double() for t in ts], ups)
    assert_close(ours, ref, 1e-5 if triton else 1e-12, f"{backend} {decay} init={init}")


def test_packed_documents_across_the_pieces_edges(one_torch_thread):
    """A packed row, split: documents restart inside pieces and across their edges (a decay of −∞ there)."""
    T, H, D = 60, 2, 6
    cu = torch.tensor([0, 1, 14, 15, 16, 31, 44, 60])  # pieces of 15: starts at, before and after their edges
    ts, ups = leaves(1, T, H, D, "dependent", False, torch.float64)
    s0 = torch.randn(cu.numel() - 1, H, D, generator=gen(), dtype=torch.float64)
    ups = ups[0], torch.randn(cu.numel() - 1, H, D, generator=gen(), dtype=torch.float64)

    def split(x, ld, th, s0):
        with time_split(4):
            return complex_scan(x, ld, th, s0, output_final_state=True, cu_seqlens=cu, backend="torch")
    ours = outputs_and_grads(split, [*ts[:3], s0], ups)
    ref = outputs_and_grads(lambda *a: complex_scan_reference(*a, output_final_state=True, cu_seqlens=cu),
                            [*ts[:3], s0], ups)  # each sequence alone
    assert_close(ours, ref, 1e-12, "packed, split")


@pytest.mark.skipif(not cpu_scan.available(), reason="no C++ compiler")
def test_a_long_float32_row_keeps_the_precision_of_one_pass(one_torch_thread):
    """Pieces of 16,000 steps at angles near 3 rad sum to about 48,000 rad, where float32 steps by 0.004: the sums
    are reduced modulo 2π in float64 first, so the split row is no less precise than one pass (each against
    float64; without the reduction it was 2.3× worse in the first of these draws)."""
    for _ in range(3):
        g = gen()
        x = torch.randn(1, 64000, 1, 4, generator=g)
        ld = torch.full((1, 2), -1e-5)
        th = 3.0 + 0.1 * torch.rand(1, 64000, 1, 2, generator=g)
        want, _ = complex_scan(x.double(), ld.double(), th.double(), backend="cpu")

        def error(y):
            return ((y.double() - want).abs().max() / want.abs().max()).item()
        one_pass = error(complex_scan(x, ld, th, backend="cpu")[0])
        with time_split(4):
            split = error(complex_scan(x, ld, th, backend="cpu")[0])
        assert split <= 1.2 * one_pass, f"split {split:.2e}, one pass {one_pass:.2e}"


def test_the_split_compiles(one_torch_thread):
    ts, ups = leaves(2, 24, 2, 6, "mixed", True, torch.float64)

    def split(x, ld, th, s0):
        with time_split(3):
            return complex_scan(x, ld, th, s0, output_final_state=True, backend="torch")
    torch._dynamo.reset()
    try:
        compiled = outputs_and_grads(torch.compile(split, fullgraph=True, backend="aot_eager"), ts, ups)
    finally:
        torch._dynamo.reset()
    assert_close(compiled, outputs_and_grads(split, ts, ups), 1e-12, "compiled")


class _StandInGPU:
    """``pieces_for`` asked about a CUDA device of ``sms`` SMs, on the CPU."""

    def __init__(self, monkeypatch, sms=132, setting="auto"):
        monkeypatch.setattr(split_module, "_sm_count", lambda index: sms)
        monkeypatch.setattr(split_module, "_SPLIT", setting)
        self.device = torch.device("cuda", 0)

    def pieces(self, B, T, H=8, P=32, backend="triton"):
        return pieces_for(B, T, H, P, self.device, backend)


def test_auto_splits_only_a_triton_grid_far_too_small_for_the_gpu(monkeypatch):
    gpu = _StandInGPU(monkeypatch)
    assert gpu.pieces(1, 65536) == 32  # 16 programs: 32 pieces of 2048 steps, 512 programs
    assert gpu.pieces(2, 32768) == 16 and gpu.pieces(1, 8192) == 8  # pieces of at least 1024 steps
    assert gpu.pieces(8, 8192) == 1  # 128 programs: near one an SM already
    assert gpu.pieces(1, 4096) == 1  # short rows are not split
    assert gpu.pieces(1, 3 * 8192) == 16 and gpu.pieces(1, 2 * 25001) == 2  # pieces of equal length
    assert gpu.pieces(1, 65536, backend="torch") == 1
    assert pieces_for(1, 65536, 8, 32, torch.device("cpu"), "triton") == 1
    assert _StandInGPU(monkeypatch, setting="off").pieces(1, 65536) == 1
    with time_split(4):
        assert pieces_for(1, 12, 1, 1, torch.device("cpu"), "torch") == 4
        with pytest.raises(ValueError, match=r"^time_split: expected a number of pieces that divides T = 10, got 4$"):
            complex_scan(torch.randn(1, 10, 1, 2), -torch.rand(1, 1), torch.rand(1, 1), backend="torch")


def test_bad_pieces_is_one_line():
    with pytest.raises(ValueError, match=r"^time_split: expected pieces, an int ≥ 1, got 0$"):
        with time_split(0):
            pass
