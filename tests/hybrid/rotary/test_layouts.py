import pytest
import torch

from hybrid.rotary import Rotary, apply_rotary, convert_layout, convert_projection, rotary_permutation


@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_permutation_round_trip_and_form(rotary_dim):
    D = 10
    fwd = rotary_permutation(D, rotary_dim)
    back = rotary_permutation(D, rotary_dim, src="half", dst="interleaved")
    assert torch.equal(fwd[back], torch.arange(D)) and torch.equal(back[fwd], torch.arange(D))
    R = rotary_dim or D
    expected = [2 * j for j in range(R // 2)] + [2 * j + 1 for j in range(R // 2)] + list(range(R, D))
    assert fwd.tolist() == expected
    assert torch.equal(rotary_permutation(D, rotary_dim, src="half", dst="half"), torch.arange(D))
    x = torch.randn(2, 3, 4, D)
    assert torch.equal(convert_layout(convert_layout(x, rotary_dim=rotary_dim), rotary_dim=rotary_dim,
                                      src="half", dst="interleaved"), x)


@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_rotation_commutes_with_conversion(rotary_dim):
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(2, 7, 3, 10, generator=gen, dtype=torch.float64)
    cos, sin = Rotary(10, rotary_dim=rotary_dim).cos_sin(7, offset=3)
    a = convert_layout(apply_rotary(x, cos, sin, rotary_dim=rotary_dim), rotary_dim=rotary_dim)
    b = apply_rotary(convert_layout(x, rotary_dim=rotary_dim), cos, sin, layout="half", rotary_dim=rotary_dim)
    torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)


def _heads(y, H):
    return y.unflatten(-1, (H, -1))  # (B, T, H·hd) -> (B, T, H, hd)


@pytest.mark.parametrize("rotary_dim", [None, 6])
@pytest.mark.parametrize("src, dst", [("interleaved", "half"), ("half", "interleaved")])
def test_converted_projections_compute_the_same_function(rotary_dim, src, dst):
    gen = torch.Generator().manual_seed(42)
    B, T, H, hd, d_in = 2, 9, 3, 10, 13
    x = torch.randn(B, T, d_in, generator=gen, dtype=torch.float64)
    wq, wk, wv = (torch.randn(H * hd, d_in, generator=gen, dtype=torch.float64) for _ in range(3))
    bq = torch.randn(H * hd, generator=gen, dtype=torch.float64)
    wo = torch.randn(d_in, H * hd, generator=gen, dtype=torch.float64)
    r_src = Rotary(hd, rotary_dim=rotary_dim, layout=src)
    r_dst = Rotary(hd, rotary_dim=rotary_dim, layout=dst)

    def model(rot, wq, bq, wk, wv, wo):
        """QK logits and a VO-RoPE output with fixed causal weights."""
        q = rot(_heads(x @ wq.T + bq, H), offset=5)
        k = rot(_heads(x @ wk.T, H), offset=5)
        logits = torch.einsum("bihd,bjhd->bhij", q, k)
        a = torch.softmax(logits, dim=-1)
        v = rot(_heads(x @ wv.T, H), offset=5)
        o = rot(torch.einsum("bhij,bjhd->bihd", a, v), offset=5, inverse=True)
        return logits, o.flatten(-2) @ wo.T

    conv = dict(rotary_dim=rotary_dim, src=src, dst=dst)
    ref_logits, ref_out = model(r_src, wq, bq, wk, wv, wo)
    new = (convert_projection(wq, H, **conv), convert_projection(bq, H, **conv), convert_projection(wk, H, **conv),
           convert_projection(wv, H, **conv), convert_projection(wo, H, dim=1, **conv))
    logits, out = model(r_dst, *new)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    back = dict(rotary_dim=rotary_dim, src=dst, dst=src)
    assert torch.equal(convert_projection(new[0], H, **back), wq)
    assert torch.equal(convert_projection(new[4], H, dim=1, **back), wo)


def test_errors():
    with pytest.raises(ValueError, match="src"):
        rotary_permutation(8, src="neox")
    with pytest.raises(ValueError, match="dst"):
        rotary_permutation(8, dst="rotate_half")
    with pytest.raises(ValueError, match="rotary_dim"):
        rotary_permutation(8, 5)
    with pytest.raises(ValueError, match="head_dim"):
        rotary_permutation(0)
    with pytest.raises(ValueError, match="n_heads"):
        convert_projection(torch.zeros(12, 4), 5)
    with pytest.raises(ValueError, match="n_heads"):
        convert_projection(torch.zeros(12, 4), 0)
    with pytest.raises(ValueError, match="dim"):
        convert_projection(torch.zeros(12, 4), 2, dim=2)
