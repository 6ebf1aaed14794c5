import pytest
import torch

from hybrid.rotary import PLACEMENTS, Rotary, RotaryPlacement, parse_placement

FLAGS = {  # the VO-RoPE post's ablation rows: (q, k, v, o, relative)
    "qk": (1, 1, 0, 0, True), "vo": (0, 0, 1, 1, True), "qkvo": (1, 1, 1, 1, True), "none": (0, 0, 0, 0, True),
    "q": (1, 0, 0, 0, False), "k": (0, 1, 0, 0, False), "v": (0, 0, 1, 0, False), "o": (0, 0, 0, 1, False),
    "qkv": (1, 1, 1, 0, False),
}


@pytest.mark.parametrize("name", list(FLAGS))
def test_flags(name):
    p = parse_placement(name.upper())
    q, k, v, o, rel = FLAGS[name]
    assert (p.q, p.k, p.v, p.o, p.is_relative, p.name) == (bool(q), bool(k), bool(v), bool(o), rel, name)
    assert parse_placement(p) is p
    assert set(PLACEMENTS) == set(FLAGS)
    with pytest.raises(Exception):
        p.q = not p.q  # frozen


def test_nope_alias():
    assert parse_placement(" NoPE ") == parse_placement("none")
    assert not parse_placement("none").any and parse_placement("o").any


def _attention(placement: RotaryPlacement, rot, q, k, v, shift):
    """Causal softmax attention (B, T, H, D) with rotary where the placement says; positions shift … shift+T−1."""
    if placement.q:
        q = rot(q, offset=shift)
    if placement.k:
        k = rot(k, offset=shift)
    if placement.v:
        v = rot(v, offset=shift)
    T = q.shape[1]
    s = torch.einsum("bihd,bjhd->bhij", q, k).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)
    return rot(o, offset=shift, inverse=True) if placement.o else o


@pytest.mark.parametrize("name", list(FLAGS))
def test_relative_placements_are_shift_invariant(name):
    gen = torch.Generator().manual_seed(31)
    rot = Rotary(10, base=50.0)
    q, k, v = (torch.randn(2, 9, 3, 10, generator=gen, dtype=torch.float64) for _ in range(3))
    p = parse_placement(name)
    base = _attention(p, rot, q, k, v, 0)
    shifted = _attention(p, rot, q, k, v, 13)
    if p.is_relative:
        torch.testing.assert_close(shifted, base, rtol=1e-5, atol=1e-5)
    else:
        assert (shifted - base).abs().max() > 1e-2


@pytest.mark.parametrize("spec", ["kq", "qk-rope", "", "qkvoo", None, 3, ["q", "k"]])
def test_unknown_spec(spec):
    with pytest.raises(ValueError, match="placement.*qk.*vo.*qkvo.*none"):
        parse_placement(spec)
