"""Attention mixer "A" against an explicit float64 reference, and its three modes against each other."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hybrid.attention import Attention, AttentionState
from hybrid.rotary import RotaryConfig

PLACEMENTS = ("none", "q", "k", "v", "o", "qk", "vo", "qkv", "qkvo")
RELATIVE = ("none", "qk", "vo", "qkvo")
SHARED_OK = ("qkvo", "qkv", "q", "o", "none")
F64 = dict(atol=1e-10, rtol=1e-9)
CAROPE, HALF = RotaryConfig(carope=True), RotaryConfig(layout="half")
# Angles, phases and cos/sin tables are float32 by design: a position shift, or CARoPE's float32 cumsum split
# at another point, moves them by float32 rounding, so such comparisons hold to float32 precision only.
F32 = dict(atol=2e-6, rtol=1e-5)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


def make(seed: int = 0, dtype=torch.float64, **kw) -> Attention:
    torch.manual_seed(seed)
    m = Attention(**kw).to(dtype)
    with torch.no_grad():  # non-zero biases, so they are tested too
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
        if m.carope is not None:  # data-dependent frequencies (the init is plain RoPE)
            m.carope.weight.normal_(0.0, 0.3)
    return m


def rand_x(B: int, T: int, d: int, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, d, generator=g, dtype=torch.float64).to(dtype)


# ------------------------------------------------------------------------------------------- reference
def rotate_ref(x, cs, layout, R, inverse=False):
    """Rotate pairs of x (B, T, H, D) by angles with cos/sin `cs` broadcastable to (B, T, H, R/2)."""
    c, s = cs
    if inverse:
        s = -s
    if layout == "interleaved":
        i0, i1 = torch.arange(0, R, 2), torch.arange(1, R, 2)
    else:
        i0, i1 = torch.arange(R // 2), torch.arange(R // 2, R)
    a, b = x[..., i0], x[..., i1]
    out = x.clone()
    out[..., i0] = a * c - b * s
    out[..., i1] = a * s + b * c
    return out


def reference(m: Attention, x: torch.Tensor, offset: int = 0, phase0=None, inv_freq=None) -> torch.Tensor:
    """o_i = R_iᵀ Σ_{i−w<j≤i} softmax_j(scale·(R_i q_i)·(R_j k_j)) R_j v_j, each rotation per placement."""
    x = x.double()
    B, T, _ = x.shape
    H, G, D, R, w = m.n_heads, m.n_kv_heads, m.head_dim, m.rotary_dim, m.window
    pl, layout = m.placement, m.rope_layout
    W = m.in_proj.weight.double()
    proj = x @ W.T + (m.in_proj.bias.double() if m.in_proj.bias is not None else 0.0)
    q = proj[..., : H * D].reshape(B, T, H, D)
    k = proj[..., H * D : (H + G) * D].reshape(B, T, G, D)
    v = k if m.shared_kv else proj[..., (H + G) * D :].reshape(B, T, G, D)

    pos = offset + torch.arange(T, dtype=torch.float64)
    if m.carope is not None:
        phases, _ = m.carope(x, phase0)  # (B, T, G, P) float32: the mixer's own CARoPE gives the angles
        cs_kv = torch.cos(phases).double(), torch.sin(phases).double()  # float32 cos/sin of float32 phases
        cs_q = tuple(c.repeat_interleave(H // G, dim=2) for c in cs_kv)  # (B, T, H, P)
    else:
        if inv_freq is None:
            inv_freq = 10000.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
        inv_freq = inv_freq.float().double()  # θ is float32; angles pos·θ in float64
        ang = (pos[:, None] * inv_freq)[None, :, None, :]  # (1, T, 1, P)
        cs_kv = cs_q = torch.cos(ang).float().double(), torch.sin(ang).float().double()  # float32 tables
    if pl.q:
        q = rotate_ref(q, cs_q, layout, R)
    if pl.k:
        k = rotate_ref(k, cs_kv, layout, R)
    if pl.v:
        v = rotate_ref(v, cs_kv, layout, R)
    if pl.q and pl.k and m.rotary is not None:  # HF's YaRN / LongRoPE factor: on the rotated channels' cos and sin
        af = float(m.rotary.attention_factor)
        q, k = (torch.cat([t[..., :R] * af, t[..., R:]], dim=-1) for t in (q, k))

    kq, vq = k.repeat_interleave(H // G, dim=2), v.repeat_interleave(H // G, dim=2)  # (B, T, H, D)
    logits = torch.einsum("bihd,bjhd->bhij", q, kq) * D**-0.5
    i, j = pos[:, None], pos[None, :]
    allowed = (j <= i) & ((j > i - w) if w is not None else True)
    a = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    o = torch.einsum("bhij,bjhd->bihd", a, vq)
    if pl.o:
        o = rotate_ref(o, cs_q, layout, R, inverse=True)
    y = o.reshape(B, T, H * D) @ m.out_proj.weight.double().T
    return y + (m.out_proj.bias.double() if m.out_proj.bias is not None else 0.0)


HEADS = {
    "mha": dict(d_model=18, n_heads=3),  # D = 6
    "gqa": dict(d_model=24, n_heads=6, n_kv_heads=2),  # D = 4
    "mqa": dict(d_model=20, n_heads=5, n_kv_heads=1),  # D = 4
}


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_reference_every_placement(placement, heads, window):
    m = make(placement=placement, window=window, bias=True, **HEADS[heads])
    for T in (1, 7, 33):
        x = rand_x(2, T, m.d_model, seed=T)
        torch.testing.assert_close(m(x)[0], reference(m, x), **F64)


@pytest.mark.parametrize(
    "kw",
    [
        dict(d_model=14, n_heads=3, head_dim=8, rotary_dim=4, rotary=HALF),
        dict(d_model=14, n_heads=3, head_dim=8, rotary_dim=4),
        dict(d_model=14, n_heads=2, head_dim=7, rotary_dim=4, window=5),  # odd head_dim, even rotary part
        dict(d_model=12, n_heads=2, rotary=RotaryConfig(layout="half", base=50.0), window=2),
        dict(d_model=14, n_heads=2, head_dim=7, placement="none"),  # odd head_dim without rotary
    ],
)
def test_reference_layouts_and_partial_rotary(kw):
    kw = {"placement": "qkvo", **kw}
    m = make(**kw)
    x = rand_x(3, 11, m.d_model)
    inv = None
    if "rotary" in kw:
        inv = kw["rotary"].base ** (-torch.arange(0, m.rotary_dim, 2, dtype=torch.float64) / m.rotary_dim)
    torch.testing.assert_close(m(x)[0], reference(m, x, inv_freq=inv), **F64)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("placement", SHARED_OK)
def test_reference_shared_kv(placement, window):
    m = make(d_model=24, n_heads=6, n_kv_heads=2, placement=placement, window=window, shared_kv=True)
    x = rand_x(2, 13, m.d_model)
    torch.testing.assert_close(m(x)[0], reference(m, x), **F64)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("placement", ["qkvo", "qk", "vo", "q"])
def test_reference_carope(placement, window):
    m = make(d_model=24, n_heads=6, n_kv_heads=2, placement=placement, window=window, rotary=CAROPE)
    x = rand_x(2, 9, m.d_model)
    torch.testing.assert_close(m(x)[0], reference(m, x), **F64)


def test_gqa_without_enable_gqa(monkeypatch):
    """torch < 2.5 has no enable_gqa: kv heads are expanded instead."""
    import importlib  # the package name is shadowed by the function hybrid.kernels.window_attention

    monkeypatch.setattr(importlib.import_module("hybrid.kernels.window_attention.blocked"), "SDPA_GQA", False)
    m = make(d_model=24, n_heads=6, n_kv_heads=2, placement="qk")
    x = rand_x(2, 9, m.d_model)
    y, _ = run_plan(m, x, [("f", 4), ("s", 2), ("f", 3)])
    torch.testing.assert_close(y, reference(m, x), **F64)


def test_scaling_attention_factor():
    """YaRN's temperature scales the logits by attention_factor² only when q and k are both rotated."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    for placement, squared in (("qk", True), ("qkvo", True), ("vo", False), ("q", False)):
        m = make(d_model=16, n_heads=2, placement=placement, rotary=RotaryConfig(scaling=yarn))
        af = m.rotary.attention_factor
        assert af > 1.0
        assert m.scale == pytest.approx(m.head_dim**-0.5 * (af**2 if squared else 1.0))
        x = rand_x(2, 10, m.d_model)
        torch.testing.assert_close(m(x)[0], reference(m, x, inv_freq=m.rotary.inv_freq), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("placement", ["qk", "qkvo"])
def test_scaling_attention_factor_partial_rotary(placement, layout):
    """With rotary_dim < head_dim the factor reaches the rotated channels' part of q·k only (HF scales cos and
    sin), in every mode: parallel, chunked, decoded, packed."""
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 8}
    m = make(d_model=30, n_heads=3, n_kv_heads=1, placement=placement, rotary_dim=6,
             rotary=RotaryConfig(scaling=yarn, layout=layout))  # D = 10: 4 channels pass through
    assert m.rotary.attention_factor > 1.2
    x = rand_x(2, 13, m.d_model)
    expected = reference(m, x, inv_freq=m.rotary.inv_freq)
    torch.testing.assert_close(m(x)[0], expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(run_plan(m, x, [("f", 5), ("s", 3), ("f", 5)])[0], expected, atol=1e-6, rtol=1e-6)
    cu_seqlens = torch.tensor([0, 13, 26])
    packed, _ = m(x.reshape(1, 26, m.d_model), cu_seqlens=cu_seqlens, output_final_state=False)
    torch.testing.assert_close(packed.reshape(x.shape), expected, atol=1e-6, rtol=1e-6)


# -------------------------------------------------------------------------------------- mode agreement
def run_plan(m: Attention, x: torch.Tensor, plan, state=None, offset: int = 0):
    """plan: [("f", n) | ("s", n)]: forward over the next n tokens, or n calls of step; x starts at `offset`."""
    ys, t = [], 0
    for mode, n in plan:
        if mode == "f":
            y, state = m(x[:, t : t + n], state, offset=offset + t)
            ys.append(y)
        else:
            for i in range(t, t + n):
                y, state = m.step(x[:, i], state, offset + i)
                ys.append(y[:, None])
        t += n
    assert t == x.shape[1]
    return torch.cat(ys, dim=1), state


T_MODES = 23
PLANS = [
    [("f", 1), ("f", 22)],
    [("f", 5), ("f", 18)],  # window 4: split not aligned
    [("f", 8), ("f", 15)],  # aligned to window 4
    [("f", 3), ("f", 2), ("f", 11), ("f", 7)],
    [("s", 23)],
    [("f", 6), ("s", 3), ("f", 9), ("s", 2), ("f", 3)],
    [("s", 2), ("f", 10), ("s", 11)],
]
MODE_CONFIGS = {
    "global-gqa-qkvo": dict(d_model=24, n_heads=6, n_kv_heads=2, placement="qkvo"),
    "window-qk": dict(d_model=18, n_heads=3, placement="qk", window=4),
    "window-mqa-v": dict(d_model=20, n_heads=5, n_kv_heads=1, placement="v", window=4),
    "shared-window-qkvo": dict(d_model=24, n_heads=6, n_kv_heads=3, placement="qkvo", shared_kv=True, window=4),
    "shared-global-qkv": dict(d_model=18, n_heads=3, placement="qkv", shared_kv=True),
    "carope-window-gqa": dict(d_model=24, n_heads=6, n_kv_heads=2, placement="qkvo", rotary=CAROPE, window=4),
    "carope-global-vo": dict(d_model=18, n_heads=3, placement="vo", rotary=CAROPE),
    "window1-o": dict(d_model=12, n_heads=2, placement="o", window=1),
    "window20-gqa-qk": dict(d_model=24, n_heads=6, n_kv_heads=2, placement="qk", window=20),  # w > most chunks
    "window30-shared-qkv": dict(d_model=18, n_heads=3, placement="qkv", shared_kv=True, window=30),  # w ≥ T
}


@pytest.mark.parametrize("config", list(MODE_CONFIGS))
def test_modes_agree(config):
    m = make(**MODE_CONFIGS[config])
    x = rand_x(2, T_MODES, m.d_model)
    tol = F32 if m.carope is not None else F64
    y_ref, s_ref = m(x)
    torch.testing.assert_close(y_ref, reference(m, x), **F64)
    for plan in PLANS:
        y, s = run_plan(m, x, plan)
        torch.testing.assert_close(y, y_ref, **tol, msg=lambda e: f"{plan}: {e}")
        assert s.length == s_ref.length
        torch.testing.assert_close(s.k, s_ref.k, **tol)
        assert (s.v is None) == (s_ref.v is None) == m.shared_kv
        if s.v is not None:
            torch.testing.assert_close(s.v, s_ref.v, **tol)
        if s.phase is not None:
            torch.testing.assert_close(s.phase, s_ref.phase, **tol)


def test_ring_holds_last_window():
    """Ring slot p % w holds the rotated key/value of position p for the last w positions."""
    kw = dict(d_model=18, n_heads=3, placement="qkvo")
    ring, grow = make(window=5, **kw), make(**kw)
    x = rand_x(2, 17, 18)
    _, s_ring = run_plan(ring, x, [("f", 9), ("s", 1), ("f", 7)])
    _, s_grow = grow(x)
    assert s_ring.k.shape[1] == 5 and s_grow.k.shape[1] == 17 and s_ring.length == 5
    for p in range(12, 17):
        torch.testing.assert_close(s_ring.k[:, p % 5], s_grow.k[:, p], **F64)
        torch.testing.assert_close(s_ring.v[:, p % 5], s_grow.v[:, p], **F64)


def test_window_state_is_fixed_size():
    m = make(d_model=4, n_heads=2, placement="qk", window=5)  # D = 2, G = 2
    B = 2
    x = rand_x(B, 4096 + 1, 4)
    state = m.init_state(B, x.device)
    for t in range(64):
        _, state = m.step(x[:, t], state, t)
    after_64 = state.nbytes
    assert after_64 == 2 * B * 5 * 2 * 2 * 8  # k and v rings: B·w·G·D float64
    for t in range(64, 4096, 504):  # prefill the rest in chunks (not aligned to w)
        _, state = m(x[:, t : t + 504], state, offset=t)
    assert state.length == 5 and state.nbytes == after_64
    # the window only sees the last w tokens, and qk is relative: the next step equals a fresh run over them
    y, state = m.step(x[:, 4096], state, 4096)
    y_fresh, _ = m(x[:, 4096 - 4 : 4097])
    torch.testing.assert_close(y, y_fresh[:, -1], atol=1e-5, rtol=1e-5)
    assert state.nbytes == after_64


def test_global_cache_grows():
    m = make(d_model=12, n_heads=3, n_kv_heads=1, placement="qkvo")  # D = 4, G = 1
    x = rand_x(2, 10, 12)
    _, state = m(x[:, :7])
    assert state.nbytes == 2 * 2 * 7 * 1 * 4 * 8
    _, state = m.step(x[:, 7], state, 7)
    assert state.nbytes == 2 * 2 * 8 * 1 * 4 * 8


# ------------------------------------------------------------------------------------------ relativity
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_relativity(placement, window):
    """Starting at position c instead of 0 changes nothing iff the placement is relative."""
    m = make(d_model=18, n_heads=3, placement=placement, window=window)
    x = rand_x(2, 9, m.d_model)
    y0, _ = m(x)
    y1, s1 = m(x, offset=37)  # a fresh state, the sequence starting at position 37
    y2, _ = run_plan(m, x, [("s", 4), ("f", 5)], m.init_state(2, x.device), offset=37)
    torch.testing.assert_close(y1, reference(m, x, offset=37), **F64)
    torch.testing.assert_close(y2, y1, **F64)
    assert s1.length == (9 if window is None else window)
    if placement in RELATIVE:
        torch.testing.assert_close(y1, y0, **F32)
    else:
        assert (y1 - y0).abs().max() > 1e-3


@pytest.mark.parametrize("placement", ["qk", "vo", "qkvo", "q", "qkv"])
def test_relativity_carope(placement):
    """With CARoPE a constant phase shift plays the role of a position shift."""
    m = make(d_model=18, n_heads=3, placement=placement, rotary=CAROPE)
    x = rand_x(2, 9, m.d_model)
    y0, _ = m(x)
    state = m.init_state(2, x.device)
    state = dataclasses.replace(state, phase=torch.rand_like(state.phase) * 6.0)
    y1, _ = m(x, state)
    torch.testing.assert_close(y1, reference(m, x, phase0=state.phase), **F64)
    if placement in RELATIVE:
        torch.testing.assert_close(y1, y0, **F32)
    else:
        assert (y1 - y0).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------- shared-KV
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("placement", SHARED_OK)
def test_shared_kv_equals_tied_weights(placement, window):
    kw = dict(d_model=24, n_heads=6, n_kv_heads=2, placement=placement, window=window, bias=True)
    shared, full = make(shared_kv=True, **kw), make(seed=5, **kw)
    H, G, D = 6, 2, 4
    with torch.no_grad():
        c_w, c_b = shared.in_proj.weight[H * D :], shared.in_proj.bias[H * D :]
        full.in_proj.weight.copy_(torch.cat([shared.in_proj.weight[: H * D], c_w, c_w]))
        full.in_proj.bias.copy_(torch.cat([shared.in_proj.bias[: H * D], c_b, c_b]))
        full.out_proj.load_state_dict(shared.out_proj.state_dict())
    x = rand_x(2, 11, 24)
    plan = [("f", 6), ("s", 2), ("f", 3)]
    (ys, ss), (yf, sf) = run_plan(shared, x, plan), run_plan(full, x, plan)
    torch.testing.assert_close(ys, yf, **F64)
    assert ss.v is None and sf.v is not None
    assert 2 * ss.nbytes == sf.nbytes
    torch.testing.assert_close(ss.k, sf.k, **F64)
    torch.testing.assert_close(ss.k, sf.v, **F64)  # the one cached tensor R_j c_j is key and value


# ------------------------------------------------------------------------------------- grads and dtype
@pytest.mark.parametrize(
    "kw",
    [
        dict(placement="qkvo", n_kv_heads=1, window=3, rotary=CAROPE, bias=True),
        dict(placement="qkvo", shared_kv=True, n_kv_heads=1, bias=True),
        dict(placement="vo", window=4),
    ],
)
def test_gradients_reach_every_parameter(kw):
    m = make(d_model=12, n_heads=2, **kw)
    x = rand_x(2, 9, 12).requires_grad_()
    y, _ = run_plan(m, x, [("f", 5), ("s", 1), ("f", 3)])
    y.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


def test_gradcheck_through_cache():
    m = make(d_model=6, n_heads=3, n_kv_heads=1, placement="qkvo", window=2)
    x = rand_x(1, 5, 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: run_plan(m, x, [("f", 3), ("s", 1), ("f", 1)])[0], (x,))


@pytest.mark.parametrize("kw", [dict(window=None), dict(window=3, rotary=CAROPE), dict(shared_kv=True, n_kv_heads=1)])
def test_bf16_keeps_dtype(kw):
    m = make(d_model=16, n_heads=4, placement="qkvo", **kw)
    mb = make(d_model=16, n_heads=4, placement="qkvo", dtype=torch.bfloat16, **kw)
    x = rand_x(2, 7, 16)
    y, state = mb(x[:, :6].bfloat16())
    assert y.dtype == torch.bfloat16 and state.k.dtype == torch.bfloat16
    y1, state = mb.step(x[:, 6].bfloat16(), state, 6)
    assert y1.dtype == torch.bfloat16
    if state.phase is not None:
        assert state.phase.dtype == torch.float32
    with torch.no_grad():
        m.load_state_dict({k: v.double() for k, v in mb.state_dict().items()})
    y_ref = reference(m, x)
    torch.testing.assert_close(torch.cat([y, y1[:, None]], 1).double(), y_ref, atol=0.1, rtol=0.05)


def test_empty_chunk_and_fresh_state():
    m = make(d_model=12, n_heads=2)
    state = m.init_state(3, "cpu")
    assert isinstance(state, AttentionState) and state.nbytes == 0 and state.length == 0
    y, s = m(rand_x(3, 0, 12), state)
    assert y.shape == (3, 0, 12) and s.length == 0


# ---------------------------------------------------------------------------------------------- errors
BASE = dict(d_model=12, n_heads=2)
BAD = [
    (dict(d_model=10, n_heads=3), "n_heads"),
    (dict(d_model=12, n_heads=0), "n_heads"),
    (dict(d_model=0, n_heads=2), "d_model"),
    (dict(BASE, n_kv_heads=4), "n_kv_heads"),
    (dict(d_model=12, n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(BASE, head_dim=5), "head_dim"),
    (dict(d_model=10, n_heads=2, placement="qk"), "head_dim"),  # head_dim 5
    (dict(BASE, rotary_dim=3), "rotary_dim"),
    (dict(BASE, rotary_dim=8), "rotary_dim"),
    (dict(BASE, window=0), "window"),
    (dict(BASE, window=-2), "window"),
    (dict(BASE, placement="xy"), "placement"),
    (dict(BASE, rotary=dict(layout="diagonal")), "^layout"),
    (dict(BASE, rotary=dict(base=1.0)), "^base"),
    (dict(BASE, rotary=dict(scaling={"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 8})),
     "^scaling"),
    (dict(BASE, rotary=dict(scaling={"rope_type": "wobbly"})), "^scaling"),
    (dict(BASE, rotary=dict(carope=True), placement="none"), "^carope"),
    (dict(BASE, rotary=dict(carope=True, scaling={"rope_type": "linear", "factor": 2.0})), "^carope: .*scaling"),
    (dict(BASE, window_backend="fast"), "^window_backend"),
    (dict(BASE, config=Attention.Config(), window=3), "^config"),
] + [(dict(BASE, shared_kv=True, placement=p), "^shared_kv") for p in ("qk", "vo", "k", "v")]


@pytest.mark.parametrize("kw,arg", BAD)
def test_constructor_errors(kw, arg):
    with pytest.raises(ValueError, match=arg):
        Attention(**{**kw, "rotary": RotaryConfig(**kw["rotary"])} if "rotary" in kw else kw)


def test_input_errors():
    m = make(**BASE)
    with pytest.raises(ValueError, match="x: expected"):
        m(torch.zeros(2, 5, 11, dtype=torch.float64))
    with pytest.raises(ValueError, match="x: expected"):
        m.step(torch.zeros(2, 1, 12, dtype=torch.float64), m.init_state(2, "cpu"))


@pytest.mark.parametrize("window", [None, 4])
def test_the_caller_passes_the_position(window):
    """States hold no position: continuing one without its offset is refused (a global cache holds more tokens
    than the position given; a window's ring was written up to another position)."""
    m = make(window=window, **BASE)
    x = rand_x(2, 6, 12)
    _, s = m(x[:, :5])
    with pytest.raises(ValueError, match=r"^offset: expected the position of x's first token, at least the "
                                         rf"{5 if window is None else 4} tokens the state holds, got 0$"):
        m.step(x[:, 5], s)  # the offset forgotten
    if window is not None:
        with pytest.raises(ValueError, match=r"^state: expected the newest state of its window cache "
                                             r"\(at position 5\), got one at position 4"):
            m.step(x[:, 5], s, 4)
    for bad, match in ((-1, r"^offset: expected an int >= 0, got -1"), (True, r"^offset: expected an int >= 0")):
        with pytest.raises(ValueError, match=match):
            m.step(x[:, 5], s, bad)
    packed = x[:1]  # (1, 6, d): two sequences of 2 and 4 tokens
    cu = torch.tensor([0, 2, 6])
    with pytest.raises(ValueError, match=r"^offset: expected 0 or a list of N=2 positions with cu_seqlens, got 3"):
        m(packed, cu_seqlens=cu, offset=3)
    with pytest.raises(ValueError, match=r"^offset: expected 0 or a list of N=2 positions with cu_seqlens, got a "
                                         r"list of 1"):
        m(packed, cu_seqlens=cu, offset=[3])


def test_global_decode_cache_appends_in_place_and_branches_stay_valid():
    """Without gradients the newest state appends in place; branching from an older state copies, and
    every branch still computes what a fresh run over its own tokens computes."""
    torch.manual_seed(3)
    attn = Attention(16, 2, placement="qkvo").eval()
    x = torch.randn(1, 12, 16)
    x_alt = torch.randn(1, 16)
    with torch.no_grad():
        y_full, _ = attn(x)
        _, s5 = attn(x[:, :5])
        _, s6 = attn.step(x[:, 5], s5, 5)
        y6, s7 = attn.step(x[:, 6], s6, 6)
        assert s7.cache is s6.cache is not None  # appended in place
        y_branch, s7b = attn.step(x_alt, s6, 6)  # s6 is no longer the newest: copy-on-write
        assert s7b.cache is not s6.cache
        y_rest = []
        for t in range(7, 12):  # continue the first branch after the second one was taken
            y_t, s7 = attn.step(x[:, t], s7, t)
            y_rest.append(y_t)
        y_ref_branch, _ = attn(torch.cat([x[:, :6], x_alt[:, None]], 1))
    torch.testing.assert_close(y6, y_full[:, 6])
    torch.testing.assert_close(torch.stack(y_rest, 1), y_full[:, 7:])
    torch.testing.assert_close(y_branch, y_ref_branch[:, 6])
    assert s7.nbytes == 2 * 12 * 2 * 8 * 4  # k and v: 12 entries × 2 heads × 8 dims, float32


# ------------------------------------------------------------------- sliding window: O(T·w), exact
WINDOW_CASES = {
    "mha-qkvo-w5": dict(d_model=18, n_heads=3, placement="qkvo", window=5),
    "gqa-qk-w1": dict(d_model=24, n_heads=6, n_kv_heads=2, placement="qk", window=1),
    "mqa-vo-w8": dict(d_model=20, n_heads=5, n_kv_heads=1, placement="vo", window=8),
    "gqa-q-w40": dict(d_model=24, n_heads=6, n_kv_heads=3, placement="q", window=40),  # w ≥ T
    "shared-gqa-qkvo-w6": dict(d_model=24, n_heads=6, n_kv_heads=2, placement="qkvo", window=6, shared_kv=True),
    "shared-mha-o-w17": dict(d_model=18, n_heads=3, placement="o", window=17, shared_kv=True),
    "mha-k-w3": dict(d_model=18, n_heads=3, placement="k", window=3),
}
WINDOW_PLANS = [
    [("f", 37)],  # parallel: several blocks of b = max(w, 16), T odd and not a multiple of w
    [("f", 11), ("f", 17), ("f", 9)],  # chunk handoffs carrying the ring
    [("f", 20), ("s", 3), ("f", 14)],  # prefill, decode, then a chunk from the decoded ring
]


def relative_error(actual, expected) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("plan", WINDOW_PLANS, ids=["parallel", "chunks", "decode"])
@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_window_against_reference_with_gradients(case, plan):
    """Outputs and the gradients of x and of every parameter equal the dense float64 reference's."""
    m = make(bias=True, **WINDOW_CASES[case])
    x = rand_x(2, 37, m.d_model, seed=7).requires_grad_()
    y, _ = run_plan(m, x, plan)
    ref = reference(m, x)
    assert relative_error(y, ref) < 1e-12
    params = [x, *m.parameters()]
    go = torch.randn_like(ref)
    grads = torch.autograd.grad(y, params, go)
    ref_grads = torch.autograd.grad(ref, params, go)
    for name, g, r in zip(["x", *dict(m.named_parameters())], grads, ref_grads):
        assert relative_error(g, r) < 1e-11, name


@pytest.mark.filterwarnings("ignore::UserWarning")  # eager FlexAttention warns (once) that it is not compiled
def test_window_backend_flex_on_cpu():
    """FlexAttention (eager off CUDA, forward only) through the layer, parallel and chunked."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    m = make(d_model=24, n_heads=6, n_kv_heads=2, placement="qkvo", window=5, window_backend="flex")
    x = rand_x(2, 29, m.d_model)
    with torch.no_grad():
        y, _ = run_plan(m, x, [("f", 12), ("f", 17)])
    torch.testing.assert_close(y, reference(m, x), **F64)


class _NewTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest number of elements of a tensor an op allocates (outputs that alias an input excluded)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("prefill", [30, 70])  # ring partly filled (masked) / full
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_decode_writes_the_ring_in_place(n_kv_heads, prefill):
    m = make(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, placement="qkvo", window=64)
    x = rand_x(2, prefill + 3, 32)
    with torch.no_grad():
        y_full, _ = m(x)
        _, s = m(x[:, :prefill])
        ring = s.k
        ys = []
        for t in range(prefill, prefill + 3):
            with _NewTensors() as probe:
                y, s = m.step(x[:, t], s, t)
            ys.append(y)
            assert s.k is ring and s.k.data_ptr() == ring.data_ptr()  # the same storage, written in place
            assert probe.largest < ring.numel() // 8  # nothing of the ring's size is allocated per token
    torch.testing.assert_close(torch.stack(ys, 1), y_full[:, prefill:], **F64)


def test_windowed_state_is_consumed_without_grad_and_clone_branches():
    m = make(d_model=18, n_heads=3, placement="qkvo", window=4)
    x, alt = rand_x(1, 12, 18), rand_x(1, 2, 18, seed=9)
    with torch.no_grad():
        _, s = m(x[:, :7])
        branch = s.clone()
        y_a, s_a = m.step(x[:, 7], s, 7)  # consumes s
        with pytest.raises(ValueError, match=r"state: expected the newest state of its window cache.*clone\(\)"):
            m.step(alt[:, 0], s, 7)
        with pytest.raises(ValueError, match=r"state: expected the newest state"):
            m(alt, s, offset=7)
        with pytest.raises(ValueError, match=r"state: expected the newest state"):
            m(alt, s.clone(), offset=7)  # a clone of a consumed state is refused too
        y_b, s_b = m(alt, branch, offset=7)  # the clone continues independently
        y_a2, _ = m(x[:, 8:], s_a, offset=8)  # and did not disturb the first branch
        ref_a, _ = m(x)
        ref_b, _ = m(torch.cat([x[:, :7], alt], 1))
    torch.testing.assert_close(torch.cat([y_a[:, None], y_a2], 1), ref_a[:, 7:], **F64)
    torch.testing.assert_close(y_b, ref_b[:, 7:], **F64)


def test_states_are_not_modified_under_autograd():
    """With gradients every update is out of place: an old windowed state can be continued again."""
    m = make(d_model=18, n_heads=3, placement="qk", window=4)
    x = rand_x(1, 10, 18)
    _, s = m(x[:, :6])
    k_before = s.k.clone()
    y1, _ = m(x[:, 6:], s, offset=6)
    y2, _ = m.step(x[:, 6], s, 6)
    torch.testing.assert_close(s.k, k_before, atol=0, rtol=0)
    torch.testing.assert_close(y2, y1[:, 0], **F64)


def test_window_backend_error():
    with pytest.raises(ValueError, match=r"window_backend: expected None, 'auto' or one of"):
        Attention(12, 2, window=3, window_backend="fast")
