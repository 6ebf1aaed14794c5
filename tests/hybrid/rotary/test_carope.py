import math

import pytest
import torch

from hybrid.rotary import CARoPE, Rotary, apply_rotary, cos_sin_from_phases
from hybrid.rotary.carope import wrap_phase


def _random_weights(m: CARoPE, seed: int):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 0.3)
        m.bias.add_(torch.randn(m.bias.shape, generator=gen) * 0.3)


def test_init_equals_rope_with_positions_from_one(ref):
    gen = torch.Generator().manual_seed(51)
    B, T, d_model, H, R, base = 2, 37, 11, 3, 14, 500.0
    m = CARoPE(d_model, H, R, base)
    x = torch.randn(B, T, d_model, generator=gen)
    phases, end = m(x)
    assert phases.shape == (B, T, H, R // 2) and phases.dtype == torch.float32 and end.shape == (B, H, R // 2)
    theta = ref.thetas(R, base)
    expected = torch.arange(1, T + 1, dtype=torch.float64)[:, None] * theta  # (T, P): (m+1)·θ_i
    torch.testing.assert_close(phases.double(), expected[None, :, None, :].expand(B, T, H, -1), rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(m.increments(x).double(), theta.expand(B, T, H, -1), rtol=1e-6, atol=0)
    # the same cos/sin as Rotary at offset 1
    cos, sin = cos_sin_from_phases(phases)
    rc, rs = Rotary(R, base=base).cos_sin(T, offset=1)
    torch.testing.assert_close(cos, rc[None, :, None].expand_as(cos), rtol=0, atol=1e-5)
    torch.testing.assert_close(sin, rs[None, :, None].expand_as(sin), rtol=0, atol=1e-5)


def test_bias_init_value(ref):
    m = CARoPE(4, 2, 10, base=10000.0)
    f = 1.0 / (ref.softplus(float(m.bias.detach()[0])) + 1.0)
    assert f == pytest.approx(10000.0 ** (-2.0 / 10), rel=1e-6)
    assert torch.equal(m.weight, torch.zeros(2, 4))


def test_matches_float64_reference_with_random_weights(ref):
    gen = torch.Generator().manual_seed(52)
    m = CARoPE(9, 2, 6, 100.0)
    _random_weights(m, 53)
    x = torch.randn(3, 13, 9, generator=gen)
    start = torch.randn(3, 2, 3, generator=gen)
    W, b = m.weight.double(), m.bias.double()
    z = x.double() @ W.T + b  # (B, T, H)
    f = 1.0 / (torch.log1p(torch.exp(z)) + 1.0)
    inc = f[..., None] ** torch.arange(3, dtype=torch.float64)  # (B, T, H, P)
    expected = start.double()[:, None] + torch.cumsum(inc, dim=1)
    phases, end = m(x, start)
    torch.testing.assert_close(phases.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(end, wrap_phase(phases[:, -1]), rtol=0, atol=0)
    same_angle(end, expected[:, -1].float())
    torch.testing.assert_close(m.increments(x).double(), inc, rtol=1e-5, atol=1e-6)
    assert bool(((inc > 0) & (inc <= 1)).all())


def same_angle(a: torch.Tensor, b: torch.Tensor) -> None:
    """a and b are the same angles up to multiples of 2π."""
    torch.testing.assert_close(wrap_phase(a - b), torch.zeros_like(a), rtol=0, atol=2e-6)


def test_continuation_chunked_and_per_token():
    gen = torch.Generator().manual_seed(54)
    m = CARoPE(7, 3, 10)
    _random_weights(m, 55)
    x = torch.randn(2, 19, 7, generator=gen)
    full, full_end = m(x)
    assert full[:, -1].abs().max() > 2 * math.pi  # the carried phase is wrapped below
    torch.testing.assert_close(full_end, wrap_phase(full[:, -1]), rtol=0, atol=0)
    assert bool((full_end >= -math.pi).all() and (full_end < math.pi).all())
    parts, phase = [], None
    for a, b in [(0, 4), (4, 5), (5, 12), (12, 19)]:
        p, phase = m(x[:, a:b], phase)
        parts.append(p)
    same_angle(torch.cat(parts, 1), full)
    same_angle(phase, full_end)
    phase, steps = None, []
    for t in range(19):
        p, phase = m(x[:, t : t + 1], phase)
        steps.append(p)
    same_angle(torch.cat(steps, 1), full)
    empty, same = m(x[:, :0], phase)
    assert empty.shape == (2, 0, 3, 5) and torch.equal(same, phase)


def test_token_by_token_phases_stay_as_accurate_as_one_pass_at_long_lengths():
    """The carried phase is kept mod 2π: carried unwrapped in float32 it reached 20,000 rad, whose spacing
    (2e-3 rad) token-by-token decoding accumulated to 4e-3 rad by T = 20,000 (one pass: 6e-5)."""
    torch.manual_seed(0)
    m = CARoPE(8, 2, 4)  # pair 1's increments are fractions of a radian (pair 0's are exactly 1)
    with torch.no_grad():
        m.weight.normal_(0, 0.3)
    x = torch.randn(1, 20000, 8)
    with torch.no_grad():
        exact, _ = m.double()(x.double())
        m.float()
        one_pass, _ = m(x)
        phase, steps = None, []
        for t in range(x.shape[1]):
            p, phase = m(x[:, t : t + 1], phase)
            steps.append(p)
    one_pass_error = wrap_phase(one_pass.double() - exact).abs().max().item()
    step_error = wrap_phase(torch.cat(steps, 1).double() - exact).abs().max().item()
    assert one_pass_error < 2e-4 and step_error < 4e-4, (one_pass_error, step_error)


def test_gradients_reach_weight_and_bias():
    gen = torch.Generator().manual_seed(56)
    m = CARoPE(8, 2, 6)
    _random_weights(m, 57)
    x = torch.randn(2, 9, 8, generator=gen)
    q = torch.randn(2, 9, 2, 6, generator=gen)
    phases, _ = m(x)
    cos, sin = cos_sin_from_phases(phases)
    y = apply_rotary(q, cos, sin)
    y.square().mul(torch.linspace(0, 1, 6)).sum().backward()
    for p in (m.weight, m.bias):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0

    # and they agree with float64 autograd on the reference formula
    W, b = m.weight.detach().double().requires_grad_(), m.bias.detach().double().requires_grad_()
    f = 1.0 / (torch.nn.functional.softplus(x.double() @ W.T + b) + 1.0)
    ph = torch.cumsum(f[..., None] ** torch.arange(3, dtype=torch.float64), 1)
    qd = q.double()
    y0 = qd[..., 0::2] * ph.cos() - qd[..., 1::2] * ph.sin()
    y1 = qd[..., 0::2] * ph.sin() + qd[..., 1::2] * ph.cos()
    yd = torch.stack((y0, y1), -1).flatten(-2)
    yd.square().mul(torch.linspace(0, 1, 6, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(m.weight.grad.double(), W.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.bias.grad.double(), b.grad, rtol=1e-4, atol=1e-5)


def test_bf16_input_and_reset():
    m = CARoPE(6, 2, 4)
    _random_weights(m, 58)
    x = torch.randn(1, 5, 6).to(torch.bfloat16)
    assert m(x)[0].dtype == torch.float32 and m.increments(x).dtype == torch.float32
    m.reset_parameters()
    assert torch.equal(m.weight, torch.zeros(2, 6))
    assert 1.0 / (math.log1p(math.exp(float(m.bias.detach()[1]))) + 1) == pytest.approx(1e4 ** -0.5, rel=1e-6)


def test_errors():
    for kwargs, match in [
        (dict(d_model=0, n_heads=2, rotary_dim=4), "d_model"),
        (dict(d_model=4, n_heads=0, rotary_dim=4), "n_heads"),
        (dict(d_model=4, n_heads=2, rotary_dim=5), "rotary_dim"),
        (dict(d_model=4, n_heads=2, rotary_dim=4, base=1.0), "base"),
    ]:
        with pytest.raises(ValueError, match=match):
            CARoPE(**kwargs)
    m = CARoPE(4, 2, 6)
    with pytest.raises(ValueError, match="x: expected"):
        m(torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="x: expected"):
        m(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="phase"):
        m(torch.zeros(2, 3, 4), torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="phases"):
        cos_sin_from_phases(torch.zeros(2, 3))


def test_float64_inputs_compute_in_float64():
    gen = torch.Generator().manual_seed(59)
    m = CARoPE(5, 2, 8).double()
    _random_weights(m, 60)
    x = torch.randn(2, 6, 5, generator=gen, dtype=torch.float64)
    phases, end = m(x)
    assert phases.dtype == end.dtype == torch.float64
    f = 1.0 / (torch.nn.functional.softplus(x @ m.weight.detach().T + m.bias.detach()) + 1.0)
    expected = torch.cumsum(f[..., None] ** torch.arange(4, dtype=torch.float64), 1)
    torch.testing.assert_close(phases, expected, rtol=1e-12, atol=1e-12)
    assert cos_sin_from_phases(phases)[0].dtype == torch.float64
