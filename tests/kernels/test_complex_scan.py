"""complex_scan: the torch backend, the reference, the step and the argument checks.

Ground truth is float64: the sequential reference, itself checked against the closed form
``o_i = Σ_{j≤i} γ^{i−j} R_{j−i} v_j`` of VO-RoPE (Su Jianlin, "The Road to Transformer Upgrades: the
second type of rotary position encoding", 2025). The Triton backend has its own file.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from hybrid.kernels.complex_scan import blocked, cpu_scan, interface
from hybrid.kernels import complex_scan, complex_scan_reference, complex_scan_step
from hybrid.kernels.complex_scan.interface import resolve_backend

_seed = itertools.count(1234)


def gen() -> torch.Generator:
    """A fresh generator per draw: different inputs in every case, reproducible run to run."""
    return torch.Generator().manual_seed(next(_seed))


def inputs(B, T, H, D, *, dependent, dtype=torch.float64, init=False, decay_range=(0.0, 0.7)):
    P = D // 2
    shape = (B, T, H, P) if dependent else (H, P)
    lo, hi = decay_range
    x = torch.randn(B, T, H, D, generator=gen(), dtype=torch.float64).to(dtype)
    log_decay = -(lo + (hi - lo) * torch.rand(shape, generator=gen(), dtype=torch.float64))
    theta = math.pi * (2 * torch.rand(shape, generator=gen(), dtype=torch.float64) - 1)
    s0 = torch.randn(B, H, D, generator=gen(), dtype=torch.float64) if init else None
    return x, log_decay, theta, s0


def assert_close_scaled(actual, expected, tol, what=""):
    """max |actual − expected| ≤ tol · max(1, max |expected|)."""
    actual, expected = actual.double(), expected.double()
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    err = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:.1g} × scale {scale:.3g}"


# ---------------------------------------------------------------- the reference against the closed form


def closed_form(x, log_decay, theta):
    """o_i = Σ_{j≤i} γ^{i−j} R_{j−i} v_j for static γ, θ, written with real 2×2 rotations."""
    B, T, H, D = x.shape
    P = D // 2
    out = torch.zeros_like(x)
    v = x.view(B, T, H, P, 2)
    for i in range(T):
        for j in range(i + 1):
            n = i - j
            ang = -n * theta  # R_{j−i} rotates by (j − i)·θ
            c, s = torch.cos(ang), torch.sin(ang)
            g = torch.exp(n * log_decay)
            re = c * v[:, j, ..., 0] - s * v[:, j, ..., 1]
            im = s * v[:, j, ..., 0] + c * v[:, j, ..., 1]
            out.view(B, T, H, P, 2)[:, i, ..., 0] += g * re
            out.view(B, T, H, P, 2)[:, i, ..., 1] += g * im
    return out


def test_reference_equals_vo_rope_closed_form():
    x, ld, th, _ = inputs(2, 9, 3, 6, dependent=False)
    y, _ = complex_scan_reference(x, ld, th)
    assert_close_scaled(y, closed_form(x, ld, th), 1e-12, "reference vs closed form")


# ---------------------------------------------------------------- torch backend against the reference

SHAPES = [  # (B, T, H, D)
    (2, 1, 3, 2),
    (1, 7, 5, 6),
    (2, 63, 3, 10),
    (1, 200, 3, 64),
    (1, 1031, 1, 128),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dependent", [False, True], ids=["static", "dependent"])
@pytest.mark.parametrize("init", [False, True], ids=["zero0", "init"])
def test_torch_backend_matches_reference_float64(shape, dependent, init):
    x, ld, th, s0 = inputs(*shape, dependent=dependent, init=init)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True, backend="torch")
    y_ref, fin_ref = complex_scan_reference(x, ld, th, s0, output_final_state=True)
    assert y.dtype == torch.float64 and fin.dtype == torch.float64
    assert_close_scaled(y, y_ref, 1e-12, "y")
    assert_close_scaled(fin, fin_ref, 1e-12, "final_state")


@pytest.mark.parametrize("block_size", [1, 5, 16, 64, 500])
def test_torch_backend_any_block_size(block_size):
    x, ld, th, s0 = inputs(2, 97, 3, 8, dependent=True, init=True)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True, backend="torch", block_size=block_size)
    y_ref, fin_ref = complex_scan_reference(x, ld, th, s0, output_final_state=True)
    assert_close_scaled(y, y_ref, 1e-12, "y")
    assert_close_scaled(fin, fin_ref, 1e-12, "final_state")


@pytest.mark.parametrize("dependent", [False, True], ids=["static", "dependent"])
def test_float32_within_float32_tolerance(dependent):
    x, ld, th, s0 = inputs(2, 300, 3, 16, dependent=dependent, init=True, dtype=torch.float32)
    y, fin = complex_scan(x, ld.float(), th.float(), s0.float(), output_final_state=True, backend="torch")
    assert y.dtype == torch.float32 and fin.dtype == torch.float32
    y_ref, fin_ref = complex_scan_reference(x.double(), ld.float().double(), th.float().double(), s0.float().double(),
                                            output_final_state=True)
    assert_close_scaled(y, y_ref, 2e-5, "y")
    assert_close_scaled(fin, fin_ref, 2e-5, "final_state")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_within_their_tolerance(dtype):
    x, ld, th, _ = inputs(2, 150, 3, 8, dependent=True, dtype=dtype)
    y, fin = complex_scan(x, ld, th, output_final_state=True, backend="torch")
    assert y.dtype == dtype and fin.dtype == torch.float32
    y_ref, fin_ref = complex_scan_reference(x.double(), ld.float().double(), th.float().double(),
                                            output_final_state=True)
    # math is fp32; the only loss is rounding y to the half type (relative 2^-8 for bf16)
    tol = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    assert_close_scaled(y, y_ref, tol, "y")
    assert_close_scaled(fin, fin_ref, 1e-5, "final_state")


@pytest.mark.parametrize("log_decay", [-1e-7, -20.0])
def test_extreme_decays(log_decay):
    x, _, th, s0 = inputs(2, 130, 3, 8, dependent=True, init=True)
    ld = torch.full_like(th, log_decay)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True, backend="torch", block_size=32)
    y_ref, fin_ref = complex_scan_reference(x, ld, th, s0, output_final_state=True)
    assert_close_scaled(y, y_ref, 1e-12, "y")
    assert_close_scaled(fin, fin_ref, 1e-12, "final")


@pytest.mark.parametrize(
    "ld_shape,th_shape",
    [((3, 4), (2, 50, 3, 4)), ((2, 50, 3, 4), (3, 4)), ((50, 3, 1), (1, 4)), ((2, 1, 3, 4), (1, 50, 1, 4)), ((), (4,))],
)
def test_broadcast_shapes(ld_shape, th_shape):
    x, _, _, s0 = inputs(2, 50, 3, 8, dependent=False, init=True)
    ld = -torch.rand(ld_shape, generator=gen(), dtype=torch.float64)
    th = torch.randn(th_shape, generator=gen(), dtype=torch.float64)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True, backend="torch", block_size=8)
    y_ref, fin_ref = complex_scan_reference(x, ld, th, s0, output_final_state=True)
    assert_close_scaled(y, y_ref, 1e-12, "y")
    assert_close_scaled(fin, fin_ref, 1e-12, "final")


def test_poisoned_buffers_are_fully_written(monkeypatch):
    def poisoned(*shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(blocked, "empty_buffer", poisoned)
    x, ld, th, s0 = inputs(2, 45, 3, 6, dependent=True, init=True)
    leaves = [t.clone().requires_grad_() for t in (x, ld, th, s0)]
    y, fin = complex_scan(*leaves[:3], leaves[3], output_final_state=True, backend="torch", block_size=8)  # 5 blocks + a tail of 5
    y_ref, fin_ref = complex_scan_reference(x, ld, th, s0, output_final_state=True)
    assert_close_scaled(y, y_ref, 1e-12, "y")
    assert_close_scaled(fin, fin_ref, 1e-12, "final")
    grads = torch.autograd.grad(y.sum() + fin.sum(), leaves)
    for g in grads:
        assert torch.isfinite(g).all()


# ---------------------------------------------------------------- continuation and the step


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("split", [1, 17, 40])
def test_continuation(backend, split):
    x, ld, th, s0 = inputs(2, 57, 3, 6, dependent=True, init=True)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True, backend=backend)
    y_a, fin_a = complex_scan(x[:, :split], ld[:, :split], th[:, :split], s0, output_final_state=True, backend=backend)
    y_b, fin_b = complex_scan(x[:, split:], ld[:, split:], th[:, split:], fin_a, output_final_state=True, backend=backend)
    assert_close_scaled(torch.cat([y_a, y_b], 1), y, 1e-12, "concatenated outputs")
    assert_close_scaled(fin_b, fin, 1e-12, "final state")


@pytest.mark.parametrize("dependent", [False, True])
def test_step_repeated_equals_scan(dependent):
    x, ld, th, s0 = inputs(2, 23, 3, 10, dependent=dependent, init=True)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True, backend="torch")
    state = s0
    for t in range(x.shape[1]):
        ld_t = ld[:, t] if dependent else ld
        th_t = th[:, t] if dependent else th
        y_t, state = complex_scan_step(x[:, t], ld_t, th_t, state)
        assert_close_scaled(y_t, y[:, t], 1e-12, f"step {t}")
    assert_close_scaled(state, fin, 1e-12, "final state")


@pytest.mark.parametrize("dependent", [False, True])
def test_step_in_real_pairs_equals_the_complex_step(dependent, graph_recorder):
    """The transition as real pairs (what a compiled step takes: Inductor generates no code for complex tensors)
    gives the complex product's states, step after step, from a state and from none; and a compiled step
    (Dynamo tracing it, the eager backend) takes that path and equals the scan."""
    from hybrid.kernels.complex_scan import complex_scan_transition_step, transition_pairs

    x, ld, th, s0 = inputs(2, 9, 3, 10, dependent=dependent, init=True)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True, backend="torch")
    backend = graph_recorder()
    compiled = torch.compile(complex_scan_step, backend=backend, fullgraph=True)
    for state in (s0, None):
        real_state = complex_state = compiled_state = state
        for t in range(x.shape[1]):
            ld_t, th_t = (ld[:, t], th[:, t]) if dependent else (ld, th)
            a = torch.exp(torch.complex(ld_t, -th_t))
            y_c, complex_state = complex_scan_transition_step(x[:, t], a, complex_state)
            y_r, real_state = complex_scan_transition_step(x[:, t], transition_pairs(ld_t, th_t), real_state)
            assert_close_scaled(y_r, y_c, 1e-14, f"step {t}")
            _, compiled_state = compiled(x[:, t], ld_t, th_t, compiled_state, check_values=False)
        assert_close_scaled(real_state, complex_state, 1e-14, "final state")
        if state is not None:
            assert_close_scaled(compiled_state, fin, 1e-12, "compiled final state")
    traced = [str(node.target) for gm in backend.graphs for node in gm.graph.nodes]
    assert traced and not [t for t in traced if "complex" in t], traced  # no complex op reaches the compiler


def test_step_from_zero_state_and_dtypes():
    x, ld, th, _ = inputs(2, 1, 3, 4, dependent=False, dtype=torch.bfloat16)
    y_t, state = complex_scan_step(x[:, 0], ld, th, None)
    assert y_t.dtype == torch.bfloat16 and state.dtype == torch.float32
    torch.testing.assert_close(state, x[:, 0].float(), rtol=0, atol=0)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    "dependent,init,T,block",
    [(False, False, 11, 4), (True, True, 13, 5), (True, False, 1, None), (False, True, 20, 64)],
)
def test_gradcheck_torch_backend(dependent, init, T, block):
    x, ld, th, s0 = inputs(2, T, 3, 4, dependent=dependent, init=init, decay_range=(0.05, 0.6))
    args = [x.requires_grad_(), ld.requires_grad_(), th.requires_grad_()]
    if init:
        args.append(s0.requires_grad_())

    def fn(*a):
        return complex_scan(a[0], a[1], a[2], a[3] if init else None, output_final_state=True, backend="torch", block_size=block)

    assert torch.autograd.gradcheck(fn, tuple(args), eps=1e-6, atol=1e-8)


def test_float32_gradients_match_reference():
    x, ld, th, s0 = inputs(2, 150, 3, 8, dependent=True, init=True, dtype=torch.float32)
    ld, th, s0 = ld.float(), th.float(), s0.float()
    gy = torch.randn(x.shape, generator=gen())
    gf = torch.randn(s0.shape, generator=gen())

    def grads(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (x, ld, th, s0)]
        y, fin = fn(*leaves)
        return torch.autograd.grad((y * gy.to(dtype)).sum() + (fin * gf.to(dtype)).sum(), leaves)

    ours = grads(lambda *a: complex_scan(*a, output_final_state=True, backend="torch"), torch.float32)
    ref = grads(lambda *a: complex_scan_reference(*a, output_final_state=True), torch.float64)
    for name, g, r in zip(("x", "log_decay", "theta", "initial_state"), ours, ref):
        assert g.dtype == torch.float32
        # relative to each tensor's own scale: an absolute floor would pass a small, wrong gradient
        err = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert err < 1e-5, f"grad {name}: relative error {err:.2e}"


@pytest.mark.parametrize("scale", [1000.0, 8000.0])
def test_float32_static_decay_with_large_angles(scale):
    """A static decay's powers a^k come from exp(k·z): the angle is wrapped into [−π, π) first (in float64), so a
    large θ keeps float32's accuracy, forward and gradients. Before, k·θ carried k times θ's rounding: relative
    errors 1.4e-4 at |θ| < 1000 and 1.8e-3 at |θ| < 8000, where the per-token path and the cpu scan gave 2e-6."""
    x, ld, th, s0 = inputs(2, 150, 3, 8, dependent=False, init=True, dtype=torch.float32)
    ld, th, s0 = ld.float(), (scale / math.pi * th).float(), s0.float()  # |θ| < scale
    gy = torch.randn(x.shape, generator=gen())

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (x, ld, th, s0)]
        y, _ = fn(*leaves)
        return (y, *torch.autograd.grad((y * gy.to(dtype)).sum(), leaves))

    ours = run(lambda *a: complex_scan(*a, output_final_state=True, backend="torch", block_size=64), torch.float32)
    ref = run(lambda *a: complex_scan_reference(*a, output_final_state=True), torch.float64)
    for name, g, r in zip(("y", "grad x", "grad log_decay", "grad theta", "grad initial_state"), ours, ref):
        err = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert err < 2e-5, f"{name}: relative error {err:.2e}"


def test_torch_backend_gradients_of_an_empty_batch():
    """B = 0 with a per-token decay and angle: each gradient its own empty tensor (an empty view is contiguous,
    and the custom op refused two views of one buffer)."""
    x, ld, th, s0 = inputs(0, 8, 3, 10, dependent=True)
    for theta in (th, th[..., :1, :1]):  # (0, T, H, P) and (0, T, 1, 1)
        leaves = [t.requires_grad_() for t in (x.clone(), ld.clone(), theta.clone())]
        y, _ = complex_scan(*leaves, backend="torch")
        grads = torch.autograd.grad(y.sum(), leaves)
        assert [g.shape for g in grads] == [t.shape for t in leaves]


# ---------------------------------------------------------------- argument checks and dispatch


def test_empty_sequence_returns_the_initial_state():
    x, ld, th, s0 = inputs(2, 0, 3, 4, dependent=False, init=True)
    y, fin = complex_scan(x, ld, th, s0, output_final_state=True)
    assert y.shape == (2, 0, 3, 4)
    torch.testing.assert_close(fin, s0)


def _ok():
    x = torch.randn(2, 5, 3, 4)
    return x, -torch.rand(3, 2), torch.rand(3, 2)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda x, ld, th: (torch.randn(2, 5, 3, 5), ld, th, None), r"x: .*even.*D=5"),
        (lambda x, ld, th: (x.long(), ld, th, None), r"x: expected a real floating dtype.*int64"),
        (lambda x, ld, th: (x[0], ld, th, None), r"x: expected shape \(B, T, H, D\), got \(5, 3, 4\)"),
        (lambda x, ld, th: (x, -torch.rand(4, 2), th, None), r"log_decay: shape \(4, 2\) does not broadcast"),
        (lambda x, ld, th: (x, ld, torch.rand(2, 6, 3, 2), None), r"theta: shape \(2, 6, 3, 2\) does not broadcast"),
        (lambda x, ld, th: (x, ld.abs() + 0.1, th, None), r"log_decay: expected values <= 0"),
        (lambda x, ld, th: (x, ld.long(), th, None), r"log_decay: expected a floating dtype"),
        (lambda x, ld, th: (x, ld, th, torch.zeros(2, 3, 6)), r"initial_state: expected shape \(B, H, D\) = \(2, 3, 4\), got \(2, 3, 6\)"),
        (lambda x, ld, th: (x, ld, th, torch.zeros(2, 3, 4, dtype=torch.int32)), r"initial_state: expected a float32"),
        (lambda x, ld, th: (x, ld, th, "state"), r"initial_state: expected a tensor"),
        (lambda x, ld, th: ("x", ld, th, None), r"x: expected a torch.Tensor"),
    ],
)
def test_value_errors(mutate, match):
    with pytest.raises(ValueError, match=match):
        complex_scan(*mutate(*_ok()))


def test_value_errors_options(monkeypatch):
    x, ld, th = _ok()
    with pytest.raises(ValueError, match=r"block_size: expected a positive int or None, got 0"):
        complex_scan(x, ld, th, block_size=0)
    with pytest.raises(ValueError, match=r"backend: expected one of .*got 'cuda'"):
        complex_scan(x, ld, th, backend="cuda")
    monkeypatch.setenv("HYBRID_SCAN_BACKEND", "fast")
    with pytest.raises(ValueError, match=r"HYBRID_SCAN_BACKEND: expected one of .*got 'fast'"):
        complex_scan(x, ld, th)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"backend: the 'triton' backend needs CUDA tensors.*TRITON_INTERPRET=1"):
        complex_scan(x, ld, th, backend="triton")
    with pytest.raises(ValueError, match=r"^backend: the 'triton' backend computes in float32 .* got float64 x; "
                                         r"use 'torch' \(or 'auto', which picks it\)$"):
        complex_scan(x.double(), ld, th, backend="triton")


def test_auto_never_picks_triton_for_float64(monkeypatch):
    """The Triton kernels compute in float32: a float64 x on CUDA goes to the torch backend (before, it reached
    the kernels, which failed on its 8-byte values)."""
    monkeypatch.delenv("HYBRID_SCAN_BACKEND", raising=False)
    monkeypatch.setattr(interface, "triton_available", lambda: True)
    cuda = torch.device("cuda")
    assert resolve_backend(None, cuda, torch.float32) == "triton"
    assert resolve_backend(None, cuda, torch.bfloat16) == "triton"
    assert resolve_backend(None, cuda, torch.float64) == "torch"


def test_step_value_errors():
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"x_t: expected shape \(B, H, D\)"):
        complex_scan_step(x[None], -torch.rand(3, 2), torch.rand(3, 2), None)
    with pytest.raises(ValueError, match=r"log_decay_t: expected values <= 0"):
        complex_scan_step(x, torch.rand(3, 2) + 0.1, torch.rand(3, 2), None)
    with pytest.raises(ValueError, match=r"state: expected shape \(B, H, D\) = \(2, 3, 4\)"):
        complex_scan_step(x, -torch.rand(3, 2), torch.rand(3, 2), torch.zeros(2, 4))


def test_backend_resolution(monkeypatch):
    monkeypatch.delenv("HYBRID_SCAN_BACKEND", raising=False)
    assert resolve_backend(None, torch.device("cpu")) == ("cpu" if cpu_scan.available() else "torch")
    monkeypatch.setenv("HYBRID_SCAN_BACKEND", "reference")
    assert resolve_backend(None, torch.device("cpu")) == "reference"
    assert resolve_backend("torch", torch.device("cpu")) == "torch"  # the argument wins over the variable
    x, ld, th, _ = inputs(1, 6, 2, 4, dependent=False)
    y_env, _ = complex_scan(x, ld, th)  # through the reference
    y_torch, _ = complex_scan(x, ld, th, backend="torch")
    assert_close_scaled(y_env, y_torch, 1e-12, "env-selected backend")


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_nan_and_inf_decays_and_angles_are_refused(backend):
    """NaN passes a `> 0` test; the check is `not <= 0`. θ must be finite. −inf log γ (γ = 0) is allowed."""
    x = torch.randn(2, 5, 3, 6)
    good_decay, good_theta = -torch.rand(3, 3), torch.rand(3, 3)
    nan = torch.full((3, 3), float("nan"))
    for log_decay, theta, match in [
        (nan, good_theta, r"log_decay: expected values <= 0 .*got 9 NaN"),
        (good_decay.clone().index_fill_(0, torch.tensor([1]), float("nan")), good_theta, r"log_decay: .*got 3 NaN"),
        (good_decay, nan, r"theta: expected finite angles, got 9 NaN and 0 inf"),
        (good_decay, torch.full((3, 3), float("inf")), r"theta: expected finite angles, got 0 NaN and 9 inf"),
    ]:
        with pytest.raises(ValueError, match=match):
            complex_scan(x, log_decay, theta, backend=backend)
        with pytest.raises(ValueError, match=match.replace("log_decay", "log_decay_t").replace("theta", "theta_t")):
            complex_scan_step(x[:, 0], log_decay, theta, None)
    y, _ = complex_scan(x, torch.full((3, 3), float("-inf")), good_theta, backend=backend)  # γ = 0: y_t = x_t
    assert torch.equal(y, x)
