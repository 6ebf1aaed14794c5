import math

import pytest
import torch

from hybrid.rotary import Rotary, inv_freq


def ref_cos_sin(theta32, positions):
    """cos/sin of (exact position)·(stored float32 θ), evaluated in float64."""
    ang = torch.tensor(positions, dtype=torch.float64)[:, None] * theta32.double()[None, :]
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("offset", [0, 5, 1_000_003])
def test_cos_sin_positions_and_precision(offset):
    rot = Rotary(14, rotary_dim=10, base=500.0)
    rot.table_limit = 4096  # a million positions in: computed directly, not tabulated
    cos, sin = rot.cos_sin(9, offset=offset)
    assert cos.shape == sin.shape == (9, 5) and cos.dtype == torch.float32
    theta = torch.tensor([500.0 ** (-2.0 * i / 10) for i in range(5)], dtype=torch.float64)
    torch.testing.assert_close(rot.inv_freq.double(), theta, rtol=6.1e-8, atol=0)
    rc, rs = ref_cos_sin(rot.inv_freq, list(range(offset, offset + 9)))
    # one rounding to float32, even a million positions in (an fp32 angle would be off by ~0.03 rad)
    torch.testing.assert_close(cos.double(), rc, rtol=0, atol=1.2e-7)
    torch.testing.assert_close(sin.double(), rs, rtol=0, atol=1.2e-7)


def test_cache_reuse_growth_and_devices():
    rot = Rotary(8)
    c1, _ = rot.cos_sin(10)
    c2, _ = rot.cos_sin(4, offset=3)
    assert c2.data_ptr() == c1[3:].data_ptr()  # a view of the same cached table
    assert torch.equal(c2, c1[3:7])
    c3, _ = rot.cos_sin(100, offset=50)  # grows the table: same values, recomputed
    assert torch.equal(rot.cos_sin(10)[0], c1) and torch.equal(Rotary(8).cos_sin(100, offset=50)[0], c3)
    assert rot.cos_sin(0, offset=7)[0].shape == (0, 4)
    small = Rotary(8)
    small.table_limit = 64  # past the limit: rows computed per call, bit-identical to the table's
    assert torch.equal(small.cos_sin(30, offset=60)[0], c3[10:40])
    assert torch.equal(small.cos_sin(40, offset=20)[0], rot.cos_sin(40, offset=20)[0])
    cached = small.cos_sin(1)[0]  # a view of the cached table: its storage holds at most table_limit rows
    assert cached.untyped_storage().nbytes() <= 64 * cached.shape[1] * cached.element_size()
    assert rot.cos_sin(3, device="cpu")[0].device.type == "cpu"


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_forward_offset_continuation_and_inverse(layout, ref):
    gen = torch.Generator().manual_seed(21)
    rot = Rotary(12, rotary_dim=8, layout=layout)
    x = torch.randn(2, 23, 3, 12, generator=gen)
    full = rot(x, offset=4)
    parts = torch.cat([rot(x[:, :5], offset=4), rot(x[:, 5:6], offset=9), rot(x[:, 6:], offset=10)], dim=1)
    assert torch.equal(full, parts)
    ang = torch.arange(4, 27, dtype=torch.float64)[:, None] * rot.inv_freq.double()
    torch.testing.assert_close(full.double(), ref.rotate(x, ang[None, :, None, :], layout, 8), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rot(full, offset=4, inverse=True), x, rtol=1e-6, atol=1e-6)
    assert torch.equal(full[..., 8:], x[..., 8:])
    xb = x.to(torch.bfloat16)
    assert rot(xb).dtype == torch.bfloat16


def test_qk_rope_is_relative():
    gen = torch.Generator().manual_seed(22)
    rot = Rotary(10, base=100.0)
    q, k = torch.randn(1, 1, 1, 10, generator=gen), torch.randn(1, 1, 1, 10, generator=gen)
    logits = []
    for m, n in [(3, 10), (0, 7), (1000, 1007), (123_456, 123_463)]:
        logits.append(float((rot(q, offset=m) * rot(k, offset=n)).sum()))
    assert max(logits) - min(logits) < 2e-5
    assert abs(float((rot(q, offset=0) * rot(k, offset=3)).sum()) - logits[0]) > 1e-3  # offset matters


def test_vo_rope_shift_invariance(ref):
    """o_i = R_iᵀ Σ_j a_ij R_j v_j is unchanged by shifting every position, for fixed weights a_ij."""
    gen = torch.Generator().manual_seed(23)
    T, H, D = 11, 2, 10
    rot = Rotary(D, rotary_dim=8, layout="half")
    v = torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)
    a = torch.softmax(torch.randn(H, T, T, generator=gen, dtype=torch.float64), dim=-1)

    def vo(shift):
        rv = rot(v, offset=shift)
        mixed = torch.einsum("hij,bjhd->bihd", a, rv)
        return rot(mixed, offset=shift, inverse=True)

    base = vo(0)
    for shift in (1, 37, 4097):
        torch.testing.assert_close(vo(shift), base, rtol=1e-5, atol=1e-5)
    # and it equals Σ_j a_ij R_{j−i} v_j, written with the reference rotation
    theta = rot.inv_freq.double()
    rel = torch.zeros_like(v)
    for i in range(T):
        for j in range(T):
            ang = ((j - i) * theta)[None, None, None, :]
            rel[:, i] += a[:, i, j][None, :, None] * ref.rotate(v[:, j : j + 1], ang, "half", 8)[:, 0]
    torch.testing.assert_close(base, rel, rtol=1e-5, atol=1e-5)


def test_dynamic_frequencies_follow_total_length():
    sc = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}
    rot = Rotary(8, scaling=sc)
    plain = inv_freq(8)[0]
    assert torch.equal(rot.inv_freq, plain)
    c, s = rot.cos_sin(6, offset=10)  # total 16 = L0: plain frequencies
    rc, rs = ref_cos_sin(plain, list(range(10, 16)))
    torch.testing.assert_close(c.double(), rc, rtol=0, atol=1.2e-7)
    c, s = rot.cos_sin(6, offset=20)  # total 26 > L0: base·(2·26/16 − 1)^(8/6)
    theta = torch.tensor([(1e4 * (2 * 26 / 16 - 1) ** (8 / 6)) ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
    rc, rs = ref_cos_sin(theta.float(), list(range(20, 26)))
    torch.testing.assert_close(c.double(), rc, rtol=0, atol=2e-7)
    torch.testing.assert_close(s.double(), rs, rtol=0, atol=2e-7)
    assert rot.cos_sin(6, offset=20)[0] is c  # memoised
    assert rot.attention_factor == 1.0


def test_longrope_switches_factors_above_original_length():
    sc = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0], "long_factor": [1.0, 4.0, 9.0],
          "factor": 8.0, "original_max_position_embeddings": 32}
    rot = Rotary(6, scaling=sc, base=100.0)
    assert rot.attention_factor == pytest.approx(math.sqrt(1 + math.log(8.0) / math.log(32)))
    short = torch.tensor([100.0 ** (-2 * i / 6) / f for i, f in enumerate([1.0, 1.5, 2.0])])
    long = torch.tensor([100.0 ** (-2 * i / 6) / f for i, f in enumerate([1.0, 4.0, 9.0])])
    c, _ = rot.cos_sin(4, offset=28)
    torch.testing.assert_close(c.double(), ref_cos_sin(short, list(range(28, 32)))[0], rtol=0, atol=2e-7)
    c, _ = rot.cos_sin(4, offset=29)
    torch.testing.assert_close(c.double(), ref_cos_sin(long, list(range(29, 33)))[0], rtol=0, atol=2e-7)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_packed_rows_past_a_length_threshold_are_each_sequences_own_and_read_nothing_back(rope_type):
    """A packed batch whose sequences end below and past L0 = 8 (from offsets, as a context-parallel shard's): each
    sequence's rows are exactly ``cos_sin`` of its own total length, and they trace whole (``fullgraph``: no
    offset read back to pick the frequencies, a sync per layer of a training step on a GPU)."""
    scaling = {"rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 8}
    if rope_type == "longrope":
        scaling.update(short_factor=[1.0, 1.5, 2.0, 2.5, 3.0], long_factor=[1.0, 3.0, 5.0, 7.0, 9.0])
    rot = Rotary(12, rotary_dim=10, base=500.0, scaling=scaling)
    cu = torch.tensor([0, 3, 13, 14, 30])  # lengths 3, 10, 1, 16
    packed = torch.compile(rot.cos_sin_packed, fullgraph=True, backend="eager")
    for offsets in (None, torch.tensor([0, 2, 9, 0])):
        cos, sin = packed(cu, 30, offsets, 0 if offsets is None else 9)
        for n in range(4):
            s, e, o = int(cu[n]), int(cu[n + 1]), 0 if offsets is None else int(offsets[n])
            want_cos, want_sin = rot.cos_sin(e - s, o)
            assert torch.equal(cos[s:e], want_cos) and torch.equal(sin[s:e], want_sin), (n, offsets)


def test_module_dtype_cast_does_not_degrade_angles():
    rot = Rotary(8)
    c32 = rot.cos_sin(50, offset=10_000)[0].clone()
    rot2 = Rotary(8).to(torch.bfloat16)
    assert torch.equal(rot2.cos_sin(50, offset=10_000)[0], c32)


def test_yarn_attention_factor_and_not_in_cos_sin():
    rot = Rotary(16, scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64})
    assert rot.attention_factor == pytest.approx(0.1 * math.log(8.0) + 1)
    c, s = rot.cos_sin(20)
    torch.testing.assert_close(c * c + s * s, torch.ones_like(c), rtol=0, atol=1e-6)  # orthogonal rotation


def test_state_dict_has_no_buffers():
    assert Rotary(8).state_dict() == {}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=0), "dim"),
        (dict(dim=7), "dim: expected an even int"),
        (dict(dim=8, rotary_dim=10), "rotary_dim"),
        (dict(dim=8, rotary_dim=3), "rotary_dim"),
        (dict(dim=8, layout="neox"), "layout"),
        (dict(dim=8, base=0.5), "base"),
        (dict(dim=8, scaling={"rope_type": "yarn", "factor": 2.0}), "original_max_position_embeddings"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Rotary(**kwargs)


def test_call_errors():
    rot = Rotary(8)
    with pytest.raises(ValueError, match="seq_len"):
        rot.cos_sin(-1)
    with pytest.raises(ValueError, match="offset"):
        rot.cos_sin(3, offset=-2)
    with pytest.raises(ValueError, match="offset"):
        rot.cos_sin(3, offset=1.0)
    with pytest.raises(ValueError, match="x: expected"):
        rot(torch.zeros(1, 2, 3, 6))
    with pytest.raises(ValueError, match="x: expected"):
        rot(torch.zeros(2, 3, 8))


def test_integer_tensors_are_refused():
    """Rotating int64 values would truncate them back to integers: a one-line error instead."""
    from hybrid.rotary import apply_rotary

    rope = Rotary(8)
    with pytest.raises(ValueError, match=r"^x: expected a float tensor, got dtype int64$"):
        rope(torch.ones(1, 3, 2, 8, dtype=torch.int64))
    cos, sin = rope.cos_sin(3, 0, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"^x: expected a float tensor, got dtype int32$"):
        apply_rotary(torch.ones(1, 3, 2, 8, dtype=torch.int32), cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_compiled_rows_equal_the_table_and_leave_no_side_effect(dtype, graph_recorder):
    """Under torch.compile the rows are computed in the graph, never stored: a cache filled while tracing made every
    compiled model trace twice (its guard "no table yet" fails at the second call). One graph for three calls at
    three offsets, the rows those of the eager table (float64 angles, one rounding; bfloat16 buffers: from the
    float32 copy), and the cache still empty."""
    rot = Rotary(12, rotary_dim=10, base=500.0).to(dtype)
    x = torch.randn(2, 7, 3, 12, dtype=torch.float64).to(dtype)
    counting = graph_recorder()
    graphs = counting.graphs

    compiled = torch.compile(rot, backend=counting, dynamic=True)
    got = [compiled(x, offset=offset) for offset in (0, 5, 9)]
    assert not rot._tables
    for offset, rows in zip((0, 5, 9), got):
        torch.testing.assert_close(rows, rot(x, offset=offset), rtol=0, atol=0)  # eager: from the table
    assert rot._tables and torch.equal(compiled(x, offset=2), rot(x, offset=2))  # a filled cache: no new graph
    assert len(graphs) == 1


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_compiled_rows_past_a_length_threshold_equal_eager_and_leave_no_side_effect(rope_type, graph_recorder):
    """Past L0 the frequencies of dynamic NTK depend on the total length and longrope's switch to the long factors.
    Under torch.compile they are computed in the graph too (longrope's from a copy made at construction): eager
    caches them, and a frequency or row stored while tracing made every call past L0 trace again. Totals 11, 16
    and 20 past L0 = 8 (positions from 0, 5 and 9): two graphs (the first static, the second with T and the
    offset symbolic), each call's rows exactly eager's, and no cache written."""
    scaling = {"rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 8}
    if rope_type == "longrope":
        scaling.update(short_factor=[1.0, 1.5, 2.0, 2.5, 3.0], long_factor=[1.0, 3.0, 5.0, 7.0, 9.0])
    rot = Rotary(12, rotary_dim=10, base=500.0, scaling=scaling).double()
    x = torch.randn(2, 11, 3, 12, dtype=torch.float64)
    counting = graph_recorder()
    graphs = counting.graphs

    compiled = torch.compile(rot, backend=counting)
    calls = [(x, 0), (x[:, :7], 9), (x, 5), (x[:, :9], 3)]
    thetas = dict(rot._thetas)  # the frequencies the cast put on the module's device
    got = [compiled(t, offset=offset) for t, offset in calls]
    assert not rot._tables and rot._thetas == thetas and rot._last is None
    for (t, offset), rows in zip(calls, got):
        torch.testing.assert_close(rows, rot(t, offset=offset), rtol=0, atol=0)  # eager: from its caches
    assert len(graphs) == 2
