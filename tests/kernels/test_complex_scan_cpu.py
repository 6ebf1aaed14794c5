"""The compiled CPU scan (backend "cpu") against the float64 sequential reference, and its build.

Float64 inputs run the float64 build of the kernel, so forward and gradients must match the reference to
float64 rounding; float32 ones to a relative 1e-5 per tensor (max|err| / max|ref|). Sizes are odd, the
heads × pairs of a step leave partial row blocks (8 to 256 pairs, across head boundaries), and decays /
angles take every broadcast shape.
"""
from __future__ import annotations

import importlib.util
import itertools
import math
import os
import subprocess
import sys

import pytest
import torch

from hybrid.kernels import complex_scan, complex_scan_reference
from hybrid.kernels.complex_scan import cpu_build, cpu_scan
from hybrid.kernels.complex_scan.interface import resolve_backend

pytestmark = pytest.mark.skipif(not cpu_scan.available(), reason="no C++ compiler: the cpu backend is off")

_seed = itertools.count(4321)


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def draw(shape, lo=-1.0, hi=1.0):
    return lo + (hi - lo) * torch.rand(shape, generator=gen(), dtype=torch.float64)


def relative_error(got, want) -> float:
    want = want.detach().double()
    scale = want.abs().max().item()
    return (got.detach().double() - want).abs().max().item() / scale if scale else got.abs().max().item()


def both(leaves, ups, dtype, **kw):
    """(y, final, *grads) of the cpu backend in ``dtype`` and of the float64 reference, same inputs."""
    def run(fn, dt):
        ts = [None if t is None else t.to(dt).requires_grad_() for t in leaves]
        y, f = fn(*ts)
        wrt = [t for t in ts if t is not None]
        grads = torch.autograd.grad((y * ups[0].to(y.dtype)).sum() + (f * ups[1].to(f.dtype)).sum(), wrt)
        return (y, f, *grads)

    ours = run(lambda *a: complex_scan(*a, output_final_state=True, backend="cpu", **kw), dtype)
    ref = run(lambda *a: complex_scan_reference(*a, output_final_state=True), torch.float64)
    return ours, ref


NAMES = ("y", "final", "grad x", "grad log_decay", "grad theta", "grad initial_state")

CASES = [  # (B, T, H, D, decay shape, angle shape, initial state)
    (1, 1, 1, 2, "static", "static", False),
    (2, 7, 3, 6, "dep", "dep", True),
    (3, 45, 2, 70, "static", "dep", True),  # 70 pairs a step: rows of 48 and 22, across the two heads
    (2, 33, 5, 130, "dep", "static", False),  # 325 pairs a step: five rows of 64 and one of 5
    (2, 61, 3, 10, (1, 61, 3, 5), (2, 1, 1, 5), True),  # time-varying shared by the batch / per-batch static
    (1, 300, 1, 4, "dep", "dep", True),
]


def make(B, T, H, D, lds, ths, init):
    P = D // 2

    def shape(spec):
        return {"static": (H, P), "dep": (B, T, H, P)}.get(spec, spec)

    x = draw((B, T, H, D), -2, 2)
    ld = draw(shape(lds), -0.8, 0.0)
    th = draw(shape(ths), -math.pi, math.pi)
    s0 = draw((B, H, D), -2, 2) if init else None
    ups = (draw((B, T, H, D)), draw((B, H, D)))
    return [x, ld, th, s0], ups


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}T{}H{}D{}-{}-{}-{}".format(*c))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_and_gradients_match_reference(case, dtype):
    leaves, ups = make(*case)
    ours, ref = both(leaves, ups, dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for name, got, want in zip(NAMES, ours, ref):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert torch.isfinite(got).all(), name
        err = relative_error(got, want)
        assert err < tol, f"{name}: relative error {err:.2e}"


def test_gradcheck():
    leaves, _ = make(2, 9, 2, 6, "dep", "static", True)
    leaves = [t.requires_grad_() for t in leaves]
    assert torch.autograd.gradcheck(lambda *a: complex_scan(*a, output_final_state=True, backend="cpu"), tuple(leaves))


@pytest.mark.parametrize("use", ["y", "final"])
def test_one_output_and_partial_grads(use):
    leaves, ups = make(2, 19, 3, 8, "dep", "dep", True)

    def grads(fn):
        x, ld, th, s0 = (t.clone() for t in leaves)
        x.requires_grad_()
        th.requires_grad_()
        y, f = fn(x, ld, th, s0)
        return torch.autograd.grad((y * ups[0]).sum() if use == "y" else (f * ups[1]).sum(), (x, th))

    for name, got, want in zip(("x", "theta"), grads(lambda *a: complex_scan(*a, output_final_state=True, backend="cpu")),
                               grads(lambda *a: complex_scan_reference(*a, output_final_state=True))):
        assert relative_error(got, want) < 1e-12, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs(dtype):
    leaves, _ = make(2, 40, 3, 8, "dep", "dep", True)
    leaves[0] = leaves[0].to(dtype)
    y, final = complex_scan(leaves[0], *(t.float() for t in leaves[1:]), output_final_state=True, backend="cpu")
    assert y.dtype == dtype and final.dtype == torch.float32
    y_ref, _ = complex_scan_reference(leaves[0].double(), *(t.float().double() for t in leaves[1:]))
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    assert ((y.double() - y_ref).abs() <= unit * y_ref.abs() + 1e-5 * y_ref.abs().max()).all()


def test_continuation_and_threads():
    leaves, _ = make(3, 200, 4, 70, "dep", "dep", True)  # large enough to run threaded
    x, ld, th, s0 = leaves
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # threaded whatever this process's share of the CPUs (tests/conftest.py)
        y, f = complex_scan(x, ld, th, s0, output_final_state=True, backend="cpu")
        y_a, f_a = complex_scan(x[:, :77], ld[:, :77], th[:, :77], s0, output_final_state=True, backend="cpu")
        y_b, f_b = complex_scan(x[:, 77:], ld[:, 77:], th[:, 77:], f_a, output_final_state=True, backend="cpu")
        torch.set_num_threads(1)
        y1, f1 = complex_scan(x, ld, th, s0, output_final_state=True, backend="cpu")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.cat([y_a, y_b], 1), y) and torch.equal(f_b, f)
    assert torch.equal(y1, y) and torch.equal(f1, f)  # rows are independent: bitwise the same


def test_poisoned_buffers_are_fully_written(monkeypatch):
    def poisoned(*shape, dtype):
        return torch.full(shape, float("nan"), dtype=dtype)

    monkeypatch.setattr(cpu_scan, "empty_buffer", poisoned)
    leaves, ups = make(2, 23, 3, 70, "static", "dep", True)
    ours, ref = both(leaves, ups, torch.float64)
    for name, got, want in zip(NAMES, ours, ref):
        assert relative_error(got, want) < 1e-12, name


def test_default_backend_on_cpu(monkeypatch):
    monkeypatch.delenv("HYBRID_SCAN_BACKEND", raising=False)
    assert resolve_backend(None, torch.device("cpu")) == "cpu"


# ---------------------------------------------------------------- the build


def _load_builder():
    """cpu_build.py imported on its own (no torch), as each concurrent builder does below."""
    spec = importlib.util.spec_from_file_location("cpu_build_alone", cpu_build.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_concurrent_first_builds_agree(tmp_path):
    """Three processes building into one empty cache at once: all load a library, one file remains, no
    temporary file is left behind."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('b', {cpu_build.__file__!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "lib = m.load()\n"
        "print(lib._name if lib is not None else 'NONE')\n"
    )
    env = {"HYBRID_CACHE": str(tmp_path), "PATH": os.environ["PATH"]}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    names = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    files = sorted(f.name for f in (tmp_path / "kernels").iterdir())
    assert len(names) == 1 and "NONE" not in names and len(files) == 1 and files[0].endswith(".so")


def test_no_compiler_falls_back_to_torch(tmp_path, monkeypatch):
    builder = _load_builder()
    monkeypatch.setenv("HYBRID_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        assert builder.load() is None
    monkeypatch.setattr(cpu_scan, "load", builder.load)  # the interface asks this module
    monkeypatch.delenv("HYBRID_SCAN_BACKEND", raising=False)
    assert resolve_backend(None, torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match=r"backend: 'cpu' was asked for but the compiled CPU scan could not"):
        complex_scan(torch.randn(1, 3, 1, 2), -torch.rand(1, 1), torch.rand(1, 1), backend="cpu")


def test_cpu_backend_rejects_other_devices():
    with pytest.raises(ValueError, match=r"backend: the 'cpu' backend needs CPU tensors, got tensors on meta"):
        resolve_backend("cpu", torch.device("meta"))


def test_failed_build_warns_and_leaves_nothing(tmp_path, monkeypatch):
    builder = _load_builder()
    monkeypatch.setenv("HYBRID_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # found on the PATH, fails every command
    with pytest.warns(RuntimeWarning, match="building the CPU scan failed"):
        assert builder.load() is None
    assert list((tmp_path / "kernels").glob("*")) == []  # no library, no temporary file


def test_in_kernel_decay_factors_are_accurate():
    """The kernel forms a = exp(log γ)·(cos θ − i sin θ) itself (vectorised polynomials in float32, libm outside
    their ranges). With s0 = 1 and x = 0, one step returns a: it must be within 3·2⁻²⁴·γ of float64 (torch's
    own float32 exp·cos is within 2.3), for log γ from −87 to 0 and |θ| up to 8192 and beyond, and exactly 0
    for log γ = −∞."""
    g = gen()
    n = 1 << 16
    edges_ld = torch.tensor([0.0, -1e-8, -20.0, -87.0, -87.2, -100.0, float("-inf")])
    ld = torch.cat([-87 * torch.rand(n, generator=g), -0.01 * torch.rand(n, generator=g), edges_ld])
    m = ld.numel()
    edges_th = torch.tensor([8192.0, 8193.0, -3e4, 1e6, math.pi, math.pi / 2, -math.pi])
    wide = (torch.rand(m // 2, generator=g) - 0.5) * 2 * 8192
    narrow = (torch.rand(m - m // 2 - len(edges_th), generator=g) - 0.5) * 8
    th = torch.cat([wide, narrow, edges_th])[torch.randperm(m, generator=g)]
    x = torch.zeros(1, 1, 1, 2 * m)
    s0 = torch.zeros(1, 1, 2 * m)
    s0[..., 0::2] = 1
    y, _ = complex_scan(x, ld.view(1, 1, 1, m), th.view(1, 1, 1, m), s0, backend="cpu")
    got_re, got_im = y[0, 0, 0, 0::2].double(), y[0, 0, 0, 1::2].double()
    gamma = ld.double().exp()
    want_re, want_im = gamma * th.double().cos(), -gamma * th.double().sin()
    normal = ld >= -87  # below, γ is subnormal in float32
    err = torch.maximum((got_re - want_re).abs(), (got_im - want_im).abs())[normal] / (gamma[normal] * 2.0**-24)
    assert err.max() < 3.0, f"max error {err.max():.2f} × 2^-24·γ"
    assert got_re[ld == float("-inf")].eq(0).all() and got_im[ld == float("-inf")].eq(0).all()
