"""The decay and angle gradients of every complex_scan backend, for decays from |a| = 1 down to e^−20.

∂log γ_t + i·∂θ_t = conj(λ_t)·a_t·s_{t−1}. Forming it as conj(λ_t)·(s_t − x_t) instead cancels when the decay is
strong (s_t ≈ x_t): at |a| = e^−20 that difference keeps no correct digit in float32. Each backend's float32
gradients are compared, tensor by tensor, with a float64 reference on the same (float32-rounded) inputs by the
RELATIVE error max|g − g_ref| / max|g_ref|, which must stay under 1e-5 (about 170 float32 roundoffs).
The Triton backend runs under the interpreter on CPU (tests/conftest.py), hence the small sizes.
"""
from __future__ import annotations

import math

import pytest
import torch

from hybrid.kernels import complex_scan, complex_scan_reference
from hybrid.kernels.complex_scan import cpu_scan
from hybrid.kernels.complex_scan.interface import triton_available

RTOL = 1e-5
LOG_DECAYS = [0.0, -1e-3, -1.0, -math.log(1e3), -math.log(1e5), -20.0]  # |a| = 1 … e^−20


def backends():
    out = ["torch"]
    out.append(pytest.param("cpu", marks=pytest.mark.skipif(not cpu_scan.available(), reason="no C++ compiler")))
    out.append(pytest.param("triton", marks=pytest.mark.skipif(not triton_available(), reason="no triton")))
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.detach().double()
    return ((got.detach().double() - want).abs().max() / want.abs().max()).item()


def inputs(seed, B, T, H, D, log_decay, dependent):
    """float32 inputs; the decay's log is ``log_decay`` (static) or within a factor 0.5–1.5 of it per step."""
    g = torch.Generator().manual_seed(seed)
    P = D // 2
    shape = (B, T, H, P) if dependent else (H, P)
    x = torch.randn(B, T, H, D, generator=g)
    ld = log_decay * (0.5 + torch.rand(shape, generator=g)) if dependent else torch.full(shape, log_decay)
    th = math.pi * (2 * torch.rand(shape, generator=g) - 1)
    s0 = torch.randn(B, H, D, generator=g)
    gy = torch.randn(B, T, H, D, generator=g)
    gf = torch.randn(B, H, D, generator=g)
    return (x, ld, th, s0), (gy, gf)


REFERENCE = lambda *a: complex_scan_reference(*a, output_final_state=True)  # the op's (y, final)


def gradients(fn, leaves, ups):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    y, final = fn(*leaves)
    loss = (y * ups[0].to(y.dtype)).sum() + (final * ups[1].to(final.dtype)).sum()
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dependent", [False, True], ids=["static", "dependent"])
@pytest.mark.parametrize("log_decay", LOG_DECAYS, ids=lambda v: f"ld{v:.3g}")
def test_float32_gradients_relative_to_float64(backend, dependent, log_decay):
    shape = (2, 13, 2, 6) if backend == "triton" else (2, 97, 3, 10)  # odd T: partial blocks / tiles
    seed = 7919 * LOG_DECAYS.index(log_decay) + 2 * dependent + len(backend)
    leaves, ups = inputs(seed, *shape, log_decay, dependent)
    ours = gradients(lambda *a: complex_scan(*a, output_final_state=True, backend=backend, block_size=8 if backend == "torch" else None),
                     leaves, ups)
    ref = gradients(REFERENCE, [t.double() for t in leaves], [u.double() for u in ups])
    for name, g, r in zip(("x", "log_decay", "theta", "initial_state"), ours, ref):
        assert g.dtype == torch.float32 and g.shape == r.shape, name
        assert torch.isfinite(g).all(), name
        err = relative_error(g, r)
        assert err < RTOL, f"{backend} grad {name}: relative error {err:.2e} at log|a| = {log_decay:g}"


def test_the_cancelling_form_fails_this_tolerance():
    """The old form conj(λ_t)·(s_t − x_t), even with an exact λ, from float32 states: at |a| ≈ e^−20 it misses
    the tolerance above by over 100×, so the test above catches it."""
    leaves, ups = inputs(11, 2, 29, 2, 6, -20.0, dependent=True)
    x, ld, th, s0 = leaves
    ref = gradients(REFERENCE, [t.double() for t in leaves], [u.double() for u in ups])
    y, _ = complex_scan_reference(x, ld, th, s0)  # float32 states s_t
    lam = ref[0].view(2, 29, 2, 3, 2)  # ∂x = λ (float64, exact)
    lam = torch.complex(lam[..., 0], lam[..., 1])
    diff = (y - x).double().view(2, 29, 2, 3, 2)
    grad_ld_old = (lam.conj() * torch.complex(diff[..., 0], diff[..., 1])).real
    assert relative_error(grad_ld_old, ref[1]) > 100 * RTOL
