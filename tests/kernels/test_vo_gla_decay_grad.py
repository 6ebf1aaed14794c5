"""vo_gla's float32 gradients under strong decay.

The decay and angle gradients are O(γ) when γ is small; the chunkwise form must not form them as the difference of
two O(1) terms (the term m = c through e^{−iφ_c}e^{iφ_c} and e^{b_c − b_c}), which keeps no correct digit in float32 at
γ = e^−20. Same metric as tests/kernels/test_complex_scan_decay_grad.py: max|g − g_ref| / max|g_ref| < 1e-5 per tensor
against float64 on the same float32-rounded inputs."""
from __future__ import annotations

import math

import pytest
import torch

from hybrid.kernels.vo_gla import vo_gla

RTOL = 1e-5
LOG_DECAYS = [0.0, -1e-3, -1.0, -math.log(1e3), -math.log(1e5), -20.0]


def relative_error(got, want):
    want = want.detach().double()
    return ((got.detach().double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("tile", [1, 4, 64])
@pytest.mark.parametrize("dependent", [False, True])
@pytest.mark.parametrize("log_decay", LOG_DECAYS)
def test_float32_decay_and_angle_gradients_under_strong_decay(log_decay, dependent, tile, packed):
    g = torch.Generator().manual_seed(0)
    B, T, H, Dk, Dv = (1, 11, 2, 3, 4) if packed else (2, 9, 2, 3, 4)
    cu = torch.tensor([0, 4, 5, 11]) if packed else None
    N = 3 if packed else B
    P = Dv // 2
    q, k = torch.randn(B, T, H, Dk, generator=g), torch.randn(B, T, H, Dk, generator=g)
    v = torch.randn(B, T, H, Dv, generator=g)
    ld = log_decay * (0.5 + torch.rand(B, T, H, generator=g)) if dependent else torch.full((H,), log_decay)
    th = math.pi * (2 * torch.rand((B, T, H, P) if dependent else (H, P), generator=g) - 1)
    s0 = torch.randn(N, H, Dk, Dv, generator=g)
    gy, gf = torch.randn(B, T, H, Dv, generator=g), torch.randn(N, H, Dk, Dv, generator=g)
    grads = {}
    for dt in (torch.float64, torch.float32):
        leaves = [t.to(dt).clone().requires_grad_() for t in (q, k, v, ld, th, s0)]
        y, f = vo_gla(*leaves, output_final_state=True, cu_seqlens=cu, tile_size=tile, backend="torch")
        grads[dt] = torch.autograd.grad((y * gy.to(dt)).sum() + (f * gf.to(dt)).sum(), leaves)
    for name, got, want in zip(("q", "k", "v", "log_decay", "theta", "initial_state"), grads[torch.float32],
                               grads[torch.float64]):
        assert relative_error(got, want) < RTOL, name


@pytest.mark.parametrize("dtype, huge", [(torch.float32, -2e38), (torch.float64, -1e308)])
@pytest.mark.parametrize("tile", [1, 2, 4])
def test_huge_finite_log_decays_give_what_a_decay_of_zero_gives(dtype, huge, tile):
    """Finite log decays whose sum in a chunk overflows to −inf (then NaN in the differences) stay finite."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1, 2, generator=g, dtype=dtype) for _ in range(3))
    th = torch.zeros(1, 1, dtype=dtype)
    ld = torch.tensor([-0.1, huge, huge, -0.1], dtype=dtype).view(1, 4, 1)
    o, f = vo_gla(q, k, v, ld, th, output_final_state=True, tile_size=tile)
    # e^-200: 0 in float32, and 1e-87 in float64
    o1, f1 = vo_gla(q, k, v, ld.clamp(min=-200.0), th, output_final_state=True, tile_size=1)
    assert torch.isfinite(o).all() and torch.isfinite(f).all()
    torch.testing.assert_close(o, o1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f, f1, rtol=1e-5, atol=1e-5)
