"""MultiScaleRetention: sum-formula reference, parallel == chunkwise == recurrent, state, grads, errors."""
import math

import pytest
import torch
import torch.nn.functional as F

from hybrid import retention as ret_mod
from hybrid.norms import head_rms_norm
from hybrid.retention import MultiScaleRetention, RetentionState, retention_log_decay
from hybrid.rotary import RotaryConfig, apply_rotary

F64 = torch.float64


def make(d_model=30, n_heads=3, head_dim=None, seed=0, **kw):
    torch.manual_seed(seed)
    m = MultiScaleRetention(d_model, n_heads, head_dim, **kw).to(F64)
    with torch.no_grad():  # O(1) activations, so every term of the formula matters
        for p in m.parameters():
            p.normal_(0.0, p.shape[1] ** -0.5)
    return m


def rotation_matrix(p, D, base, layout):
    """R_p (D, D), float64: pair k ((2k, 2k+1) interleaved, (k, k + D/2) half) rotated by p·θ_k."""
    theta = (base ** (-2.0 * torch.arange(D // 2, dtype=F64) / D)).float().double()  # float32 frequencies
    R = torch.zeros(D, D, dtype=F64)
    for k in range(D // 2):
        i, j = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, k + D // 2)
        c, s = math.cos(p * theta[k].item()), math.sin(p * theta[k].item())
        R[i, i], R[i, j], R[j, i], R[j, j] = c, -s, s, c
    return R


def reference(m, x, offset=0):
    """y from the sum formula o_n = Σ_{m≤n} γ^{n−m} (R_n q_n)·(R_m k_m) v_m, explicit loops, float64."""
    B, T, _ = x.shape
    H, D = m.n_heads, m.head_dim
    q = (x @ m.q_proj.weight.T).view(B, T, H, D)
    k = (x @ m.k_proj.weight.T).view(B, T, H, D) / math.sqrt(D)
    v = (x @ m.v_proj.weight.T).view(B, T, H, D)
    Rs = [rotation_matrix(offset + t, D, m.rope_base, m.rope_layout) for t in range(T)]
    qr = torch.stack([q[:, t] @ Rs[t].T for t in range(T)], 1)
    kr = torch.stack([k[:, t] @ Rs[t].T for t in range(T)], 1)
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)], dtype=F64)
    o = torch.zeros(B, T, H, D, dtype=F64)
    for n in range(T):
        for j in range(n + 1):
            score = (qr[:, n] * kr[:, j]).sum(-1, keepdim=True)  # (B, H, 1)
            o[:, n] += gamma[:, None] ** (n - j) * score * v[:, j]
    o = o / torch.sqrt((o**2).mean(-1, keepdim=True) + m.norm_eps)
    return (F.silu(x @ m.g_proj.weight.T) * o.reshape(B, T, H * D)) @ m.out_proj.weight.T


@pytest.mark.parametrize(
    "d_model,n_heads,head_dim,layout", [(30, 3, None, "interleaved"), (20, 3, 6, "half"), (14, 1, None, "interleaved")]
)
def test_matches_sum_formula(d_model, n_heads, head_dim, layout):
    m = make(d_model, n_heads, head_dim, rotary=RotaryConfig(layout=layout, base=500.0))
    x = torch.randn(2, 13, d_model, dtype=F64)
    y, st = m(x)
    torch.testing.assert_close(y, reference(m, x), rtol=1e-5, atol=1e-5)  # float32 cos/sin
    x2 = torch.randn(2, 6, d_model, dtype=F64)  # continuing at offset 13 = the formula over x ++ x2
    y2, _ = m(x2, st, offset=13)
    torch.testing.assert_close(y2, reference(m, torch.cat([x, x2], 1))[:, 13:], rtol=1e-5, atol=1e-5)


def test_decays():
    lg = retention_log_decay(4, dtype=F64)
    torch.testing.assert_close(lg.exp(), torch.tensor([1 - 2.0 ** (-5 - h) for h in range(4)], dtype=F64))


def test_decays_are_built_on_the_device_not_copied_from_the_host():
    """A copy from the host is a sync in every RetNet step and breaks a CUDA graph's capture (H200, 2026-11-28);
    the meta device stands in for the GPU: any copy into it from a CPU tensor is recorded."""
    from torch.utils._python_dispatch import TorchDispatchMode

    copies = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            host_in = any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
            if host_in and isinstance(out, torch.Tensor) and out.device.type != "cpu":
                copies.append(func._schema.name)
            return out

    with Record():
        lg = retention_log_decay(5, device="meta", dtype=torch.bfloat16)
    assert (lg.device.type, lg.dtype, tuple(lg.shape)) == ("meta", torch.bfloat16, (5,))
    assert copies == []


def _run_splits(m, x, splits, state=None):
    ys, t = [], 0
    for n in splits:
        y, state = m(x[:, t:t + n], state, offset=t)
        ys.append(y)
        t += n
    return torch.cat(ys, 1), state


@pytest.mark.parametrize("splits", [[6, 11], [4, 4, 4, 4, 1], [1] * 5 + [12], [17]])
def test_parallel_chunkwise_recurrent_agree(splits):
    m = make()
    x = torch.randn(2, 17, 30, dtype=F64)
    y_par, s_par = m(x)
    y_chunk, s_chunk = _run_splits(m, x, splits, m.init_state(2))
    torch.testing.assert_close(y_chunk, y_par, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_chunk.S, s_par.S, rtol=1e-10, atol=1e-10)

    state, ys = None, []
    for t in range(17):
        y_t, state = m.step(x[:, t], state, t)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y_par, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.S, s_par.S, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tile_size", [1, 4, 5, 17, 64])
def test_tile_size_changes_nothing(tile_size):
    m = make()
    x = torch.randn(2, 17, 30, dtype=F64)
    y_par, s_par = m(x)  # default tile 64 > T: one tile, the parallel form
    torch.testing.assert_close(y_par, reference(m, x), rtol=1e-5, atol=1e-5)  # float32 cos/sin
    m.tile_size = tile_size
    y, s = m(x)
    torch.testing.assert_close(y, y_par, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s.S, s_par.S, rtol=1e-10, atol=1e-10)


def test_handoffs_forward_step_forward():
    m = make()
    x = torch.randn(3, 20, 30, dtype=F64)
    y_par, s_par = m(x)
    y_a, st = m(x[:, :7])
    ys = [y_a]
    for t in range(7, 11):
        y_t, st = m.step(x[:, t], st, t)
        ys.append(y_t[:, None])
    y_b, st = m(x[:, 11:16], st, offset=11)
    y_c, st = m.step(x[:, 16], st, 16)
    y_d, st = m(x[:, 17:], st, offset=17)
    y = torch.cat(ys + [y_b, y_c[:, None], y_d], 1)
    torch.testing.assert_close(y, y_par, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(st.S, s_par.S, rtol=1e-10, atol=1e-10)


def test_the_position_is_the_callers():
    """The state holds no position: the rotary positions are the offset given (relative, so a shift of the
    whole sequence changes nothing but rounding), and a continuation at the wrong one differs."""
    m = make()
    x = torch.randn(2, 9, 30, dtype=F64)
    y, st = m(x[:, :5])
    y_shifted, st_shifted = m(x[:, :5], offset=40)
    torch.testing.assert_close(y_shifted, y, rtol=1e-5, atol=1e-5)  # float32 cos/sin at other positions
    y_rest, _ = m(x[:, 5:], st_shifted, offset=45)
    torch.testing.assert_close(y_rest, m(x)[0][:, 5:], rtol=1e-5, atol=1e-5)
    assert (m(x[:, 5:], st, offset=0)[0] - y_rest).abs().max() > 1e-3  # the offset forgotten
    with pytest.raises(ValueError, match=r"^offset: expected an int >= 0, got -2$"):
        m.step(x[:, 5], st, -2)


def test_no_time_by_time_tensor_at_default_settings():
    """Training-mode forward and backward at T = 5 tiles + 7: no tensor with two axes of length ≥ T."""
    from torch.utils._python_dispatch import TorchDispatchMode

    T = 5 * 64 + 7
    shapes = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    shapes.append(tuple(t.shape))
            return out

    m = MultiScaleRetention(24, 2)
    x = torch.randn(1, T, 24, requires_grad=True)
    with Record():
        y, _ = m(x)
        y.sum().backward()
    assert shapes and all(sum(d >= T for d in s) < 2 for s in shapes), max(shapes, key=lambda s: sum(s))


def test_state_not_modified():
    m = make()
    x = torch.randn(2, 5, 30, dtype=F64)
    _, st = m(x)
    S0 = st.S.clone()
    m(x, st, offset=5)
    m.step(x[:, 0], st, 5)
    assert torch.equal(st.S, S0)


def test_state_size_fixed():
    m = MultiScaleRetention(24, 2, tile_size=128)
    st0 = m.init_state(2)
    assert st0.S.shape == (2, 2, 12, 12) and st0.S.dtype == torch.float32
    with torch.no_grad():
        _, s64 = m(torch.randn(2, 64, 24))
        _, s1024 = m(torch.randn(2, 1024, 24))
    assert s64.nbytes == s1024.nbytes == st0.nbytes == 2 * 2 * 12 * 12 * 4
    assert torch.isfinite(s1024.S).all()


def test_gradients_reach_every_parameter():
    m = make()
    x = torch.randn(2, 9, 30, dtype=F64)
    y, st = m(x[:, :5])
    y2, st = m(x[:, 5:], st, offset=5)
    y3, st = m.step(x[:, 0], st, 9)
    (y.square().sum() + y2.square().sum() + y3.square().sum()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gradcheck_through_state():
    m = make(d_model=8, n_heads=2)
    x = torch.randn(2, 4, 8, dtype=F64, requires_grad=True)
    S = torch.randn(2, 2, 4, 4, dtype=F64, requires_grad=True)

    def f(x, S):
        y, st = m(x, RetentionState(S=S), offset=3)
        y2, st = m.step(x[:, 0], st, 7)
        return y, y2, st.S

    assert torch.autograd.gradcheck(f, (x, S))


def test_bf16_keeps_dtype():
    m = MultiScaleRetention(32, 4).bfloat16()
    x = torch.randn(2, 6, 32).bfloat16()
    y, st = m(x)
    assert y.dtype == torch.bfloat16 and st.S.dtype == torch.float32
    y1, st = m.step(x[:, 0], st, 6)
    assert y1.dtype == torch.bfloat16 and st.S.dtype == torch.float32
    assert torch.isfinite(y.float()).all() and torch.isfinite(y1.float()).all()


def test_autocast_keeps_state_float32():
    m = MultiScaleRetention(32, 4)
    x = torch.randn(2, 6, 32)
    y_ref, st_ref = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, st = m(x)
        y1, st1 = m.step(x[:, 0], st, 6)
    assert st.S.dtype == torch.float32 and st1.S.dtype == torch.float32
    torch.testing.assert_close(st.S, st_ref.S, rtol=5e-2, atol=5e-2)  # projections ran in bf16
    torch.testing.assert_close(y.float(), y_ref, rtol=5e-2, atol=5e-2)


def test_bad_args():
    cases = [
        (dict(d_model=0, n_heads=1), "d_model"),
        (dict(d_model=30, n_heads=0), "n_heads"),
        (dict(d_model=30, n_heads=4), "n_heads"),
        (dict(d_model=30, n_heads=6), "head_dim"),  # head_dim 5: odd
        (dict(d_model=30, n_heads=3, head_dim=7), "head_dim"),
        (dict(d_model=30, n_heads=3, rotary=dict(layout="rotate")), "^layout"),
        (dict(d_model=30, n_heads=3, rotary=dict(base=1.0)), "^base"),
        (dict(d_model=30, n_heads=3, tile_size=0), "^tile_size"),
        (dict(d_model=30, n_heads=3, norm_eps=-1e-6), "^norm_eps"),
        (dict(d_model=30, n_heads=3, retention_chunk=4), "^retention_chunk: expected an option of RetentionConfig"),
    ]
    for kw, name in cases:
        with pytest.raises(ValueError, match=name):
            MultiScaleRetention(**{**kw, "rotary": RotaryConfig(**kw["rotary"])} if "rotary" in kw else kw)
    m = MultiScaleRetention(30, 3)
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(2, 5, 29))
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(2, 0, 30))
    with pytest.raises(ValueError, match="x"):
        m.step(torch.randn(2, 1, 30), None)
    with pytest.raises(ValueError, match="state"):
        m(torch.randn(2, 5, 30), m.init_state(3))
    with pytest.raises(ValueError, match="state"):
        m.step(torch.randn(2, 30), RetentionState(S=torch.zeros(2, 3, 10, 9)))


# --- why torchscale's normalisations are dropped ---------------------------------------------------------


def test_group_norm_invariant_to_positive_rescaling(monkeypatch):
    """With eps = 0 the output is exactly unchanged by any positive per-(token, head) factor on o."""
    m = make(norm_eps=0.0)
    x = torch.randn(2, 11, 30, dtype=F64)
    y, _ = m(x)
    c = torch.exp(torch.randn(2, 11, 3, 1, dtype=F64) * 3)  # factors over ~e^±9
    chunkwise = ret_mod.retention_chunkwise

    def scaled(q, k, v, lg, S=None, **kw):
        o, S2 = chunkwise(q, k, v, lg, S, **kw)
        return o * c, S2

    monkeypatch.setattr(ret_mod, "retention_chunkwise", scaled)
    y_scaled, _ = m(x)
    torch.testing.assert_close(y_scaled, y, rtol=1e-12, atol=1e-12)


def rotated_qkv(m, x):
    """q̃, k̃ = k·D^−½ (rotated at positions 0 … T−1 by the layer's cos/sin tables) and v, each (B, T, H, D)."""
    B, T, _ = x.shape
    q, k, v = (proj(x).view(B, T, m.n_heads, m.head_dim) for proj in (m.q_proj, m.k_proj, m.v_proj))
    cos, sin = m.rotary.cos_sin(T)  # (T, D/2) float32
    rotate = lambda t: apply_rotary(t, cos, sin, layout=m.rope_layout)  # noqa: E731
    return rotate(q), rotate(k * m.head_dim**-0.5), v


def output(m, x, o):
    """y = W_o(swish(W_g x) ⊙ groupnorm(o)) for o (B, T, H, D), the group norm per head with the layer's eps."""
    return m.out_proj(F.silu(m.g_proj(x)) * head_rms_norm(o, m.norm_eps).flatten(2))


def test_torchscale_normalisations_change_nothing_but_eps():
    """Row-normalised decay (÷√Σ_m Dec) and scores ÷ max(|Σ_m scores|, 1) give the unnormalised output:
    exactly with eps = 0, up to the group norm's eps otherwise."""
    m = make()
    x = torch.randn(2, 40, 30, dtype=F64)
    q, k, v = rotated_qkv(m, x)  # (B, T, H, D)
    T = x.shape[1]
    n = torch.arange(T, dtype=F64)
    diff = n[:, None] - n[None, :]
    lg = retention_log_decay(m.n_heads, dtype=F64)
    dec = torch.where(diff >= 0, torch.exp(diff.clamp(min=0) * lg[:, None, None]), 0.0)  # (H, T, T)
    dec = dec / dec.sum(-1, keepdim=True).sqrt()
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * dec
    scores = scores / scores.abs().sum(-1, keepdim=True).clamp(min=1.0)
    o_ts = torch.einsum("bhnm,bmhd->bnhd", scores, v)
    y, _ = m(x)
    torch.testing.assert_close(output(m, x, o_ts), y, rtol=1e-3, atol=1e-3)  # eps = 1e-6
    m.norm_eps = 0.0
    y, _ = m(x)
    torch.testing.assert_close(output(m, x, o_ts), y, rtol=1e-10, atol=1e-10)
