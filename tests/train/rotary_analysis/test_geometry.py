"""The rotary-feature geometry of Jonasson's "Rotary Outliers and Rotary Offset Features": the sign of eq. (14) from our rotation, Definition 3.1, the bounds."""
import math

import pytest
import torch

from hybrid.rotary import apply_rotary, cos_sin_from_angles, rotary_angles
from hybrid.train.rotary_analysis import (
    is_rotary_offset_feature, lower_bound, offset_curve, pair_angle, positional_attention, upper_bound,
)
from hybrid.train.rotary_analysis.geometry import above

TWO_PI = 2 * math.pi


def polar(r, angle):
    return torch.tensor([r * math.cos(angle), r * math.sin(angle)], dtype=torch.float64)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_sign_of_eq14_comes_from_apply_rotary(layout):
    """score(query at m, key at n) = |q||k| cos(φ − θ(m − n)), not cos(φ + θ(m − n))."""
    g = torch.Generator().manual_seed(1)
    P = 5
    q, k = torch.randn(1, 1, 1, 2 * P, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 2 * P, generator=g,
                                                                                     dtype=torch.float64)
    theta = torch.rand(P, generator=g, dtype=torch.float64) * 0.9 + 0.05
    for m, n in ((7, 3), (40, 1), (5, 5), (19, 0)):
        def at(x, pos):
            cos, sin = cos_sin_from_angles(rotary_angles(torch.tensor([pos]), theta), torch.float64)
            return apply_rotary(x, cos, sin, layout=layout)
        per_pair = lambda x: (x[0, 0, 0].view(P, 2) if layout == "interleaved"  # noqa: E731
                              else torch.stack((x[0, 0, 0, :P], x[0, 0, 0, P:]), -1))
        score = per_pair(at(q, m)) * per_pair(at(k, n))  # (P, 2)
        qp, kp = per_pair(q), per_pair(k)
        phi = pair_angle(qp, kp)
        radius = qp.norm(dim=-1) * kp.norm(dim=-1)
        p = m - n
        expected = radius * torch.cos(phi - theta * p)
        torch.testing.assert_close(score.sum(-1), expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(offset_curve(qp, kp, theta, torch.tensor([float(p)]))[:, 0], expected,
                                   rtol=1e-12, atol=1e-12)
        if p:
            assert not torch.allclose(score.sum(-1), radius * torch.cos(phi + theta * p))


def test_pair_angle_known_values():
    q = torch.tensor([1.0, 0.0], dtype=torch.float64)
    cases = {(0.0, 1.0): math.pi / 2, (-1.0, 0.0): math.pi, (0.0, -1.0): 3 * math.pi / 2, (2.0, 0.0): TWO_PI,
             (1.0, 1.0): math.pi / 4}
    for k, expected in cases.items():
        assert float(pair_angle(q, torch.tensor(k, dtype=torch.float64))) == pytest.approx(expected, rel=1e-15)
    # counter-clockwise from q to k, q not on the axis
    assert float(pair_angle(polar(2.0, 1.0), polar(3.0, 0.5))) == pytest.approx(TWO_PI - 0.5, rel=1e-14)
    assert float(pair_angle(torch.zeros(2), torch.ones(2))) == TWO_PI  # degenerate: d ≡ 0


def _feature(phi, theta, p_max, rq=2.0, rk=3.0, start=0.3):
    q, k = polar(rq, start), polar(rk, start + phi)
    theta = torch.tensor(theta, dtype=torch.float64)
    return (bool(is_rotary_offset_feature(q, k, theta, p_max)), bool(upper_bound(theta, p_max)),
            bool(above(pair_angle(q, k), lower_bound(theta, p_max))))


def test_definition_and_bounds_hand_built_cases():
    p_max = 100
    edge = TWO_PI / p_max
    # θ = 2π/p_max: a full turn at p = p_max returns to d(0), so no feature qualifies; the upper bound is a tie
    assert _feature(TWO_PI, edge, p_max) == (False, False, False)
    assert _feature(1.9 * math.pi, edge, p_max) == (False, False, False)
    # just below the edge, q̄ ∥ k̄ qualifies and meets both bounds
    assert _feature(TWO_PI, 0.999 * edge, p_max) == (True, True, True)
    # φ = π: d(0) is the minimum of the cosine, never an offset feature, whatever θ
    for theta in (1e-4, 0.5 * edge, 0.99 * edge, 0.3):
        rof, _, lb = _feature(math.pi, theta, p_max)
        assert not rof and not lb
    # the lower bound as a tie: φ = π + p_max θ/2 gives d(p_max) = d(0)
    theta = 0.5 * edge
    assert _feature(math.pi + p_max * theta / 2, theta, p_max) == (False, True, False)
    assert _feature(math.pi + p_max * theta / 2 + 1e-3, theta, p_max) == (True, True, True)
    assert _feature(math.pi + p_max * theta / 2 - 1e-3, theta, p_max) == (False, True, False)
    # φ in (0, π): d(p) rises above d(0) at once
    assert _feature(2.0, 0.01, p_max) == (False, True, False)
    # aliasing: a high frequency with q̄ ∥ k̄ never returns exactly to d(0) at integer p
    assert _feature(TWO_PI, 1.0, p_max) == (True, False, False)


def test_definition_agrees_with_lower_bound_when_no_step_skips_the_arc():
    """LB ⇒ Definition 3.1 always; when θ < 2·min(φ, 2π − φ) the converse holds too (module docstring)."""
    g = torch.Generator().manual_seed(3)
    n, p_max = 4000, 64
    phi = torch.rand(n, generator=g, dtype=torch.float64) * TWO_PI
    theta = TWO_PI / p_max * 1e-3 * torch.exp(torch.rand(n, generator=g, dtype=torch.float64) * math.log(1e4))
    q = torch.stack((torch.ones(n), torch.zeros(n)), -1).double() * 1.5
    k = torch.stack((torch.cos(phi), torch.sin(phi)), -1) * 0.7
    rof = is_rotary_offset_feature(q, k, theta, p_max)
    lb = above(pair_angle(q, k), lower_bound(theta, p_max))
    assert bool((rof | ~lb).all())  # LB ⇒ ROF
    no_skip = theta < 2 * torch.minimum(phi, TWO_PI - phi)
    assert int(no_skip.sum()) > 1000 and int((rof & no_skip).sum()) > 50 and int((~rof & no_skip).sum()) > 50
    assert torch.equal(rof[no_skip], lb[no_skip])
    # a direct evaluation of d(p) < d(0) at every integer p agrees with the blocked, sign-based test
    p = torch.arange(1, p_max + 1, dtype=torch.float64)
    d = offset_curve(q, k, theta, p)  # (n, p_max)
    d0 = offset_curve(q, k, theta, torch.zeros(1))
    direct = (d < d0 - 1e-9).all(dim=1)
    clear = ((d - d0).abs() > 1e-6).all(dim=1)  # away from ties
    assert torch.equal(direct[clear], rof[clear])
    assert torch.equal(is_rotary_offset_feature(q, k, theta, p_max, block=97), rof)


def test_bound_inputs_are_checked():
    with pytest.raises(ValueError, match="p_max: expected a positive int"):
        upper_bound(torch.tensor(0.1), 0)
    with pytest.raises(ValueError, match=r"q: expected mean 2-vectors"):
        pair_angle(torch.zeros(3), torch.zeros(2))


def test_positional_attention_is_a_causal_softmax():
    g = torch.Generator().manual_seed(0)
    total = torch.randn(9, generator=g, dtype=torch.float64) * 4
    a = positional_attention(total, head_dim=16)
    for m in range(9):
        logits = torch.tensor([total[m - n] / 4.0 for n in range(m + 1)], dtype=torch.float64)
        torch.testing.assert_close(a[m, : m + 1], torch.softmax(logits, 0), rtol=1e-13, atol=0)
        assert bool((a[m, m + 1 :] == 0).all())
