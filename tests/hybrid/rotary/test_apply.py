import pytest
import torch

from hybrid.rotary import apply_rotary, cos_sin_from_angles, rotary_angles


def _angles(gen, *shape):
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) - 0.5) * 20.0


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rotary_dim", [None, 6])
@pytest.mark.parametrize("four_d", [False, True])
def test_matches_complex_reference(layout, rotary_dim, four_d, ref):
    gen = torch.Generator().manual_seed(11)
    B, T, H, D = 3, 7, 5, 10
    R = rotary_dim or D
    x = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    ang = _angles(gen, B, T, 1, R // 2) if four_d else _angles(gen, T, R // 2)
    cos, sin = ang.cos(), ang.sin()
    got = apply_rotary(x, cos, sin, layout=layout, rotary_dim=rotary_dim)
    ref_ang = ang if four_d else ang[None, :, None, :]
    torch.testing.assert_close(got, ref.rotate(x, ref_ang, layout, R), rtol=1e-12, atol=1e-12)
    inv = apply_rotary(x, cos, sin, layout=layout, rotary_dim=rotary_dim, inverse=True)
    torch.testing.assert_close(inv, ref.rotate(x, ref_ang, layout, R, inverse=True), rtol=1e-12, atol=1e-12)
    back = apply_rotary(got, cos, sin, layout=layout, rotary_dim=rotary_dim, inverse=True)
    torch.testing.assert_close(back, x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_float32_inverse_roundtrip_and_passthrough_bits(layout):
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(2, 9, 3, 14, generator=gen)
    cos, sin = cos_sin_from_angles(_angles(gen, 9, 4))
    y = apply_rotary(x, cos, sin, layout=layout, rotary_dim=8)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.equal(y[..., 8:], x[..., 8:])  # bit-identical pass-through
    z = apply_rotary(y, cos, sin, layout=layout, rotary_dim=8, inverse=True)
    torch.testing.assert_close(z, x, rtol=1e-6, atol=1e-6)
    assert torch.equal(z[..., 8:], x[..., 8:])


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_bf16_keeps_dtype_and_computes_in_fp32(layout, ref):
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(2, 5, 3, 12, generator=gen).to(torch.bfloat16)
    ang = _angles(gen, 5, 5)
    cos, sin = cos_sin_from_angles(ang)
    y = apply_rotary(x, cos, sin, layout=layout, rotary_dim=10)
    assert y.dtype == torch.bfloat16
    ref = ref.rotate(x.double(), ang[None, :, None, :], layout, 10)
    assert torch.equal(y[..., 10:], x[..., 10:])
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)
    # one rounding at the end: equal to the fp32 result rounded to bf16
    y32 = apply_rotary(x.float(), cos, sin, layout=layout, rotary_dim=10)
    assert torch.equal(y, y32.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("inverse", [False, True])
def test_interleaved_pairs_round_as_the_textbook_formula(dtype, inverse):
    """The interleaved rotation, computed as x·cos + flip(x)·(−sin, sin) in fewer ops, rounds as
    (x0·cos − x1·sin, x0·sin + x1·cos) does, bit for bit: the same two products and one addition per output."""
    gen = torch.Generator().manual_seed(15)
    x = (torch.randn(3, 7, 5, 10, generator=gen, dtype=torch.float64) * 10).to(dtype)
    cos, sin = cos_sin_from_angles(_angles(gen, 7, 5) * 50, torch.float64 if dtype == torch.float64 else torch.float32)
    got = apply_rotary(x, cos, sin, inverse=inverse)
    c, s = cos[None, :, None, :], (-sin if inverse else sin)[None, :, None, :]
    ctype = torch.float64 if dtype == torch.float64 else torch.float32
    x0, x1 = x[..., 0::2].to(ctype), x[..., 1::2].to(ctype)
    want = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).to(dtype)
    assert torch.equal(got, want)


def test_gradients_float64():
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(1, 3, 2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    ang = _angles(gen, 3, 2)
    for layout in ("interleaved", "half"):
        fn = lambda t: apply_rotary(t, ang.cos(), ang.sin(), layout=layout, rotary_dim=4)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,))


def test_rotary_angles_exact_for_large_positions():
    inv = torch.tensor([1.0, 0.1234567, 1e-4], dtype=torch.float32)
    pos = torch.tensor([0, 3, 10**7 + 1, 2**28 - 3])
    ang = rotary_angles(pos, inv)
    assert ang.dtype == torch.float64 and ang.shape == (4, 3)
    exact = [[p * float(f) for f in inv] for p in pos.tolist()]  # python floats: exact p·fp32 up to 2^53
    assert ang.tolist() == exact
    cos, sin = cos_sin_from_angles(ang)
    assert cos.dtype == sin.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(x=torch.zeros(2, 3, 4)), "x: expected"),
        (dict(layout="rotate_half"), "layout"),
        (dict(rotary_dim=5), "rotary_dim"),
        (dict(rotary_dim=10), "rotary_dim"),
        (dict(rotary_dim=0), "rotary_dim"),
        (dict(cos=torch.zeros(4, 4)), "cos"),
        (dict(cos=torch.zeros(3, 2), sin=torch.zeros(3, 2)), "cos"),
        (dict(cos=torch.zeros(3, 4, 1), sin=torch.zeros(3, 4, 1)), "cos"),
        (dict(cos=torch.zeros(2, 3, 5, 4), sin=torch.zeros(2, 3, 5, 4)), "cos"),
        (dict(cos=torch.zeros(3, 4, dtype=torch.int64), sin=torch.zeros(3, 4, dtype=torch.int64)), "cos"),
    ],
)
def test_errors_name_the_argument(kwargs, match):
    args = dict(x=torch.zeros(2, 3, 4, 8), cos=torch.ones(3, 4), sin=torch.zeros(3, 4))
    args.update(kwargs)
    x, cos, sin = args.pop("x"), args.pop("cos"), args.pop("sin")
    with pytest.raises(ValueError, match=match):
        apply_rotary(x, cos, sin, **args)


def test_rotary_angles_errors():
    with pytest.raises(ValueError, match="positions"):
        rotary_angles(torch.zeros(3), torch.ones(2))
    with pytest.raises(ValueError, match="inv_freq"):
        rotary_angles(torch.zeros(3, dtype=torch.int64), torch.ones(2, 2))
