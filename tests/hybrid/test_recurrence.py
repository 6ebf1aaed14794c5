"""The R mixer: against a float64 reference written from o_i = Σ_j γ^{i−j} R_{j−i} v_j, and across modes."""
from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import hybrid.recurrence as recurrence_module
from hybrid.kernels import complex_scan
from hybrid.recurrence import RecurrenceState, VORecurrence
from hybrid.rotary import RotaryConfig

_seed = itertools.count(7)


def gen():
    return torch.Generator().manual_seed(next(_seed))


def make(dtype=torch.float64, **kw):
    torch.manual_seed(next(_seed))
    kw.setdefault("d_model", 12)
    kw.setdefault("n_heads", 3)
    m = VORecurrence(**kw).to(dtype)
    with torch.no_grad():  # move the gates off their symmetric init so they matter
        for name, p in m.named_parameters():
            if "bias" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=gen(), dtype=p.dtype))
        if m.data_phase is not None:  # data-dependent angles that reach past π (the init is the static schedule)
            m.data_phase.weight.normal_(0.0, 1.0, generator=gen())
    return m


def x_of(B, T, d, dtype=torch.float64):
    return torch.randn(B, T, d, generator=gen(), dtype=torch.float64).to(dtype)


def reference(m: VORecurrence, x: torch.Tensor) -> torch.Tensor:
    """Float64, written out: explicit conv, explicit gates, and o_i = Σ_{j≤i} (Π γ) R_{j−i} v_j with 2×2
    rotations by the summed angles (= γ^{i−j} R_{j−i} for static γ, θ)."""
    x = x.double()
    B, T, _ = x.shape
    H, P, hd = m.n_heads, m.n_pairs, m.head_dim
    gate = F.gelu(x @ m.gate_proj.weight.double().T)
    w = x @ m.value_proj.weight.double().T  # (B, T, C)
    W = m.conv.width
    u = torch.zeros_like(w)
    for t in range(T):
        for k in range(W):
            src = t - (W - 1) + k
            if src >= 0:
                u[:, t] += m.conv.weight.double()[:, k] * w[:, src]
        u[:, t] += m.conv.bias.double()
    uh = u.view(B, T, H, hd)
    log_g = (-torch.exp(m.decay_nu.double())).expand(B, T, H, P)
    if m.selective:
        z_r = torch.einsum("bthi,hip->bthp", uh, m.recur_gate_weight.double()) + m.recur_gate_bias.double()
        r = torch.sigmoid(z_r) if m.selective_gate == "sigmoid" else (z_r / 6 + 0.5).clamp(0, 1)
        r = torch.where(r < m.hold_below, 0.0, r)  # small gates shut (hold_below; 0 = off)
        i_g = torch.sigmoid(torch.einsum("bthi,hij->bthj", uh, m.input_gate_weight.double()) + m.input_gate_bias.double())
        log_g = 8.0 * r * log_g
        uh = uh * i_g
    if m.carope is not None:
        z = x @ m.carope.weight.double().T + m.carope.bias.double()
        f = 1.0 / (F.softplus(z) + 1.0)  # (B, T, H)
        theta = f.unsqueeze(-1) ** torch.arange(P, dtype=torch.float64)
    elif m.data_phase is not None:
        dp = m.data_phase
        z = (x @ dp.weight.double().T).view(B, T, H, P) + dp.bias.double()
        if dp.phase_map == "pi-sigmoid":
            theta = math.pi / (1.0 + torch.exp(-z))  # π·σ(z)
        elif dp.phase_map == "pi-hardsigmoid":
            theta = math.pi * (z / 6 + 0.5).clamp(0, 1)
        elif dp.phase_map == "real-sign":  # the real transition 1 − 2σ(z): its sign as an angle, |·| as a decay
            real = 1.0 - 2.0 / (1.0 + torch.exp(-z))
            theta = math.pi * (real < 0).double()
            log_g = log_g + torch.log(real.abs())
        else:
            theta = 2.0 * math.pi * torch.tanh(z)
        if dp.round_to and (dp.round_at_inference or m.training):  # to the nearest multiple of 2π/n
            q = 2 * math.pi / dp.round_to
            theta = torch.round(theta / q) * q
    else:
        theta = m.theta.double().expand(B, T, H, P)
    write_sq = 1 - torch.exp(2 * log_g)
    write = torch.where(write_sq > 0, torch.sqrt(write_sq.clamp_min(recurrence_module.MIN_WRITE_SQ)), 0.0)  # 0 at γ = 1
    v = uh.reshape(B, T, H, P, 2) * write.unsqueeze(-1)
    o = torch.zeros(B, T, H, P, 2, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            g = torch.exp(log_g[:, j + 1 : i + 1].sum(1))  # Π_{j<τ≤i} γ_τ
            ang = -theta[:, j + 1 : i + 1].sum(1)  # R_{j−i}: rotate back by the angles in between
            c, s = torch.cos(ang), torch.sin(ang)
            o[:, i, ..., 0] += g * (c * v[:, j, ..., 0] - s * v[:, j, ..., 1])
            o[:, i, ..., 1] += g * (s * v[:, j, ..., 0] + c * v[:, j, ..., 1])
    o = o.reshape(B, T, H, hd)
    if m.readout_norm:  # RMS over each head's channels
        o = o / torch.sqrt(o.square().mean(-1, keepdim=True) + m.norm_eps)
    y = gate * o.reshape(B, T, H * hd)
    return y @ m.out_proj.weight.double().T


VARIANTS = {
    "static": dict(),
    "selective": dict(selective=True),
    "carope": dict(phase="carope"),
    "carope-from-rotary": dict(rotary=RotaryConfig(carope=True)),  # phase None: the rotary options say CARoPE
    "selective-carope": dict(selective=True, phase="carope"),
    "selective-learned-theta": dict(selective=True, phase="learned"),
    "data": dict(phase="data"),
    "selective-data": dict(selective=True, phase="data"),
    "selective-data-2pi-tanh": dict(selective=True, phase="data", phase_map="2pi-tanh"),
    "hard-gate-data-pi-hardsigmoid": dict(selective=True, selective_gate="hardsigmoid", phase="data",
                                          phase_map="pi-hardsigmoid"),
    "selective-data-real-sign": dict(selective=True, selective_gate="hardsigmoid", phase="data",
                                     phase_map="real-sign"),
    "data-real-sign-readout-norm": dict(phase="data", phase_map="real-sign", readout_norm=True),
    "hard-gate-hold-below": dict(selective=True, selective_gate="hardsigmoid", hold_below=0.45, phase="data"),
    "data-steepest-init": dict(phase="data", phase_init="steepest"),
    "data-rounded-to-pi": dict(selective=True, phase="data", phase_round=2, phase_round_at_inference=True),
    "data-rounded-fifths-2pi-tanh": dict(phase="data", phase_map="2pi-tanh", phase_round=5, readout_norm=True),
    "scaled-theta": dict(rotary=RotaryConfig(scaling={"rope_type": "linear", "factor": 4.0}), r_min=0.5, r_max=0.9),
    "partial-rotary": dict(rotary_dim=2, r_min=0.5, r_max=0.9),  # head_dim 4: pair 0 rotates, pair 1 does not
    "hard-gate-partial-rotary-learned": dict(selective=True, selective_gate="hardsigmoid", phase="learned",
                                             rotary_dim=2),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_float64_vo_rope_reference(variant):
    m = make(**VARIANTS[variant])
    x = x_of(2, 11, 12)
    y, state = m(x)
    torch.testing.assert_close(y, reference(m, x), rtol=1e-10, atol=1e-10)
    assert isinstance(state, RecurrenceState) and state.clone() is state  # never written in place


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_modes_agree_across_handoffs(variant, backend, monkeypatch):
    # the scan's way of computing, with tiles of 4 tokens, so the handoffs fall inside and between tiles
    scan = functools.partial(complex_scan, backend=backend, block_size=4)
    monkeypatch.setattr(recurrence_module, "complex_scan", scan)
    m = make(**VARIANTS[variant])
    x = x_of(2, 19, 12)
    y_full, s_full = m(x)
    # parallel → recurrent → chunked(parallel form over a block) → recurrent
    y1, s = m(x[:, :6])
    ys = [y1]
    for t in range(6, 9):
        y_t, s = m.step(x[:, t], s)
        ys.append(y_t.unsqueeze(1))
    y3, s = m(x[:, 9:17], s)
    ys.append(y3)
    for t in range(17, 19):
        y_t, s = m.step(x[:, t], s)
        ys.append(y_t.unsqueeze(1))
    torch.testing.assert_close(torch.cat(ys, 1), y_full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s.scan, s_full.scan, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s.conv, s_full.conv, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rotary_dim, scaling", [(2, None), (4, None), (6, {"rope_type": "linear", "factor": 4.0})])
def test_partial_rotary_rotates_the_first_pairs_only(rotary_dim, scaling):
    """θ of pair k < R/2 is base^(−2k/R) (divided by the linear factor), 0 for the pairs after; a still pair
    returns what was written d tokens ago unrotated, scaled by γ^d."""
    m = make(d_model=16, n_heads=2, rotary_dim=rotary_dim, rotary=RotaryConfig(base=100.0, scaling=scaling))
    factor = 1.0 if scaling is None else scaling["factor"]
    want = [100.0 ** (-2 * k / rotary_dim) / factor if k < rotary_dim // 2 else 0.0 for k in range(4)]
    torch.testing.assert_close(m.theta.double(), torch.tensor([want, want], dtype=torch.float64), rtol=1e-6, atol=0)
    T, d = 9, 7
    v = torch.zeros(1, T, 2, 8, dtype=torch.float64)
    v[0, 0, 0, 6:8] = torch.tensor([1.0, 2.0])  # head 0, pair 3 (still whenever R <= 6)
    log_g = torch.full((2, 4), -0.1, dtype=torch.float64)
    scan, _ = complex_scan(v, log_g, m.theta.double(), backend="reference")
    torch.testing.assert_close(scan[0, d, 0, 6:8], torch.tensor([1.0, 2.0], dtype=torch.float64) * math.exp(-0.1 * d),
                               rtol=1e-12, atol=0)


def test_step_from_no_state_equals_forward():
    m = make()
    x = x_of(3, 1, 12)
    y, s = m(x)
    y_t, s_t = m.step(x[:, 0])
    torch.testing.assert_close(y_t, y[:, 0])
    torch.testing.assert_close(s_t.scan, s.scan)


@pytest.mark.parametrize("variant", ["static", "learned", "scaled-theta", "partial-rotary", "selective", "data"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_without_autograd_reuse_the_transition_bit_for_bit(variant, dtype):
    """A decode step without autograd takes sqrt(1 − γ²) and γ e^{−iθ} of a token-free transition from a memo;
    its outputs and states are the bits of the step that computes them (under autograd), step after step, and a
    parameter changed in place (an optimizer step, load_state_dict) is seen at the next step."""
    kw = dict(phase="learned") if variant == "learned" else VARIANTS[variant]
    m = make(dtype=dtype, **kw)
    xs = x_of(3, 5, 12, dtype)

    def steps():
        state, ys = None, []
        for t in range(xs.shape[1]):
            y, state = m.step(xs[:, t], state)
            ys.append(y)
        return torch.stack(ys), state.scan

    with torch.no_grad():
        memo_y, memo_s = steps()
    want_y, want_s = (t.detach() for t in steps())  # autograd on: computed each step
    assert torch.equal(memo_y, want_y) and torch.equal(memo_s, want_s)
    assert ("_step_memo" in m.__dict__) == m._token_free_transition()
    with torch.no_grad():
        m.decay_nu.add_(0.5)  # in place, as an optimizer would
        if isinstance(m.theta, torch.nn.Parameter):
            m.theta.mul_(1.5)
        memo_y, _ = steps()
    want_y = steps()[0].detach()
    assert torch.equal(memo_y, want_y)


def test_state_size_is_fixed():
    m = make(dtype=torch.float32, d_model=16, n_heads=2)
    _, s64 = m(x_of(1, 64, 16, torch.float32))
    _, s4k = m(x_of(1, 4096, 16, torch.float32))
    assert s64.nbytes == s4k.nbytes > 0
    assert s64.nbytes == (3 * 16) * 4 + 2 * 8 * 4  # conv tail (W−1)·d_rnn + complex state H·hd, float32


@pytest.mark.parametrize(
    "kwargs",
    [dict(selective=True, phase="carope"), dict(selective=True, phase="learned"), dict(selective=True, phase="data")],
)
def test_gradients_reach_every_parameter(kwargs):
    m = make(dtype=torch.float32, **kwargs)
    y, s = m(x_of(2, 9, 12, torch.float32))
    (y.square().mean() + s.scan.square().mean()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"


def test_gradcheck_through_the_scan():
    m = make(selective=True, phase="carope", d_model=6, n_heads=1, head_dim=4)
    x = x_of(1, 5, 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: m(t)[0], (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("phase_map", ["pi-sigmoid", "2pi-tanh", "pi-hardsigmoid", "real-sign"])
@pytest.mark.parametrize("readout_norm", [False, True])
def test_gradcheck_through_the_data_phase(phase_map, readout_norm):
    """The real-sign map's gradient goes through |1 − 2σ(z)| only (its angle is a step), which is the whole
    derivative of the real transition: gradcheck's finite differences agree."""
    m = make(selective=True, phase="data", phase_map=phase_map, d_model=6, n_heads=1, head_dim=4,
             readout_norm=readout_norm)
    x = x_of(1, 5, 6).requires_grad_()
    params = (m.data_phase.weight, m.data_phase.bias)
    assert torch.autograd.gradcheck(lambda t, w, b: _with_phase(m, w, b)(t), (x, *params), eps=1e-6, atol=1e-7)


def _with_phase(m, weight, bias):
    """m's forward with the data-phase parameters given as inputs (so gradcheck differentiates them)."""
    def run(x):
        saved = m.data_phase.weight, m.data_phase.bias
        del m.data_phase.weight, m.data_phase.bias
        m.data_phase.weight, m.data_phase.bias = weight, bias
        try:
            return m(x)[0]
        finally:
            del m.data_phase.weight, m.data_phase.bias
            m.data_phase.weight, m.data_phase.bias = saved
    return run


@pytest.mark.parametrize("phase_map", ["pi-sigmoid", "2pi-tanh", "pi-hardsigmoid"])
def test_data_phase_starts_as_the_static_schedule_and_reaches_a_flip(phase_map):
    torch.manual_seed(3)
    static = VORecurrence(12, 3).double()
    data = VORecurrence(12, 3, phase="data", phase_map=phase_map).double()
    data.load_state_dict(static.state_dict(), strict=False)
    data.data_phase.reset_parameters()  # the float64 inverse of the schedule (construction rounded it to float32)
    x = x_of(2, 9, 12)
    torch.testing.assert_close(data(x)[0], static(x)[0], rtol=1e-12, atol=1e-12)  # W = 0: θ_t = the schedule
    with torch.no_grad():
        data.data_phase.bias.fill_({"pi-sigmoid": 30.0, "2pi-tanh": math.atanh(0.5), "pi-hardsigmoid": 3.0}[phase_map])
    torch.testing.assert_close(data.data_phase.increments(x), torch.full((2, 9, 3, 2), math.pi, dtype=torch.float64))


def test_rounding_acts_in_training_while_active_and_at_inference_only_when_configured():
    """phase_round=2 sends every angle to 0 or π in value with the unrounded map's gradient (straight-through);
    eval mode rounds only with phase_round_at_inference; set_phase_rounding switches training's rounding."""
    from hybrid.rotary import set_phase_rounding

    def angles(m, x):
        theta = m.data_phase.increments(x)
        (g,) = torch.autograd.grad(theta.sum(), m.data_phase.bias)
        return theta.detach(), g

    x = x_of(2, 7, 12)
    plain = make(phase="data", d_model=12, n_heads=3)
    rounded = make(phase="data", d_model=12, n_heads=3, phase_round=2)
    rounded.load_state_dict(plain.state_dict())
    theta, grad = angles(plain, x)
    on, grad_on = angles(rounded, x)
    torch.testing.assert_close(on, math.pi * (theta > math.pi / 2).double(), rtol=0, atol=0)
    torch.testing.assert_close(grad_on, grad, rtol=1e-12, atol=0)  # straight-through
    assert set_phase_rounding(rounded, False) == 1
    torch.testing.assert_close(angles(rounded, x)[0], theta, rtol=0, atol=0)
    set_phase_rounding(rounded, True)
    rounded.eval()
    torch.testing.assert_close(angles(rounded, x)[0], theta, rtol=0, atol=0)  # off at inference by default
    at_inference = make(phase="data", d_model=12, n_heads=3, phase_round=2, phase_round_at_inference=True).eval()
    at_inference.load_state_dict(plain.state_dict())
    torch.testing.assert_close(angles(at_inference, x)[0], on, rtol=0, atol=0)


def test_steepest_init_and_real_sign_init():
    """phase_init="steepest" starts every angle at π/2 (π·σ(0)); "real-sign" starts at angle 0 with the factor
    |tanh(−3/2)| on the decay."""
    x = x_of(2, 5, 12)
    steep = VORecurrence(12, 3, phase="data", phase_init="steepest").double()
    torch.testing.assert_close(steep.data_phase.increments(x), torch.full((2, 5, 3, 2), math.pi / 2, dtype=torch.float64))
    real = VORecurrence(12, 3, phase="data", phase_map="real-sign").double()
    theta, log_factor = real.data_phase.transition(x)
    assert bool((theta == 0).all())
    torch.testing.assert_close(log_factor, torch.full_like(log_factor, math.log(math.tanh(1.5))))


def test_hard_gate_holds_the_state_and_keeps_gradients_finite():
    """r_t = 0 exactly (hardsigmoid gate) means γ_t = 1 and no write: the state only turns, here by exactly π per
    token (pi-hardsigmoid at z = 3), so after T tokens it is (−1)^T times the initial one. The write's
    sqrt(1 − γ²) has an infinite derivative at γ = 1; the floor keeps every gradient finite."""
    m = make(selective=True, selective_gate="hardsigmoid", phase="data", phase_map="pi-hardsigmoid", d_model=8,
             n_heads=2)
    with torch.no_grad():
        m.recur_gate_weight.zero_()
        m.recur_gate_bias.fill_(-10.0)  # r_t = 0
        m.data_phase.weight.zero_()
        m.data_phase.bias.fill_(3.0)  # θ_t = π exactly
    x = x_of(2, 9, 8).requires_grad_()
    s0 = m.init_state(2)
    s0.scan = torch.randn(s0.scan.shape, generator=gen(), dtype=torch.float64).to(s0.scan.dtype)
    y, s = m(x, s0)
    # γ_t = 1 and no write: the state is turned by π per token and nothing else (a decay would show at 0.1, a
    # floored write sqrt(MIN_WRITE_SQ)·|i ⊙ u| at 1e-6 per token)
    torch.testing.assert_close(s.scan, -s0.scan.to(s.scan.dtype), rtol=0, atol=1e-12)
    grads = torch.autograd.grad(y.square().sum() + s.scan.sum(), (x, *m.parameters()), allow_unused=True)
    assert all(g is None or bool(torch.isfinite(g).all()) for g in grads)


def test_a_held_token_keeps_the_state_bit_for_bit():
    """r_t = 0 (the hard gate, or a gate under hold_below): γ_t = 1 and the write is exactly 0, so with θ = 0 (a
    pair past rotary_dim) the state after any number of held tokens is the initial one, bit for bit, in every
    form (forward, step)."""
    for kw in (dict(selective_gate="hardsigmoid"), dict(hold_below=0.5)):
        m = make(selective=True, rotary_dim=2, d_model=8, n_heads=2, **kw)  # head_dim 4: pair 1 has θ = 0
        with torch.no_grad():
            m.recur_gate_weight.zero_()
            m.recur_gate_bias.fill_(-10.0)  # r_t = 0, or σ(−10) < 0.5 shut by hold_below
        x = x_of(2, 40, 8)
        s0 = m.init_state(2)
        s0.scan = torch.randn(s0.scan.shape, generator=gen(), dtype=torch.float64).to(s0.scan.dtype)
        _, s = m(x, s0)
        st = s0
        for t in range(x.shape[1]):
            _, st = m.step(x[:, t], st)
        for got in (s.scan, st.scan):
            assert torch.equal(got[..., 2:], s0.scan[..., 2:])


def test_hold_below_shuts_small_gates_exactly_and_passes_the_gates_gradient():
    """hold_below = τ: log γ_t is exactly 0 where the gate r_t < τ and untouched elsewhere; the gradient is the
    plain gate's (straight-through), so d Σ log γ / d bias is the same with and without it."""
    kw = dict(selective=True, selective_gate="hardsigmoid", phase="data", d_model=8, n_heads=2)
    held = make(hold_below=0.45, **kw)
    plain = VORecurrence(**kw).double()
    plain.load_state_dict(held.state_dict())
    x = x_of(3, 10, 8)
    u = torch.randn(3, 10, held.d_rnn, generator=gen(), dtype=torch.float64)
    static = plain.log_decay().detach()  # (H, P)
    outs = []
    for m in (plain, held):
        m.zero_grad()
        _, log_decay, _ = m.scan_inputs(x, u)
        log_decay.sum().backward()
        outs.append((log_decay.detach(), m.recur_gate_bias.grad.clone()))
    (plain_ld, plain_grad), (held_ld, held_grad) = outs
    r = plain_ld / (recurrence_module.SELECTIVE_C * static)  # the gate, (B, T, H, P)
    shut = r < 0.45
    assert 0 < int(shut.sum()) < shut.numel()
    assert bool((held_ld[shut] == 0).all()) and torch.equal(held_ld[~shut], plain_ld[~shut])
    torch.testing.assert_close(held_grad, plain_grad, rtol=1e-12, atol=0)


def test_data_phase_through_the_triton_backend(monkeypatch):
    """The Triton scan (the interpreter on CPU) takes the per-token angles and gives the torch backend's
    numbers and gradients (float32, so the tolerance is the kernels' float32 one)."""
    pytest.importorskip("triton")
    m = make(dtype=torch.float32, selective=True, phase="data", d_model=8, n_heads=2)
    x = x_of(2, 7, 8, torch.float32).requires_grad_()
    outs = {}
    for backend in ("triton", "torch"):
        monkeypatch.setattr(recurrence_module, "complex_scan", functools.partial(complex_scan, backend=backend))
        y, s = m(x)
        grads = torch.autograd.grad((y.square().sum() + s.scan.sum()), (x, m.data_phase.weight))
        outs[backend] = (y, s.scan, *grads)
    for got, want in zip(outs["triton"], outs["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_low_precision_keeps_dtype():
    m = make(dtype=torch.bfloat16)
    x = x_of(2, 7, 12, torch.bfloat16)
    y, s = m(x)
    assert y.dtype == torch.bfloat16 and s.scan.dtype == torch.float32
    y_t, _ = m.step(x[:, 0], m.init_state(2, x.device, torch.bfloat16))
    assert y_t.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=10, n_heads=3), r"n_heads: expected a divisor of d_model=10 \(or set head_dim\), got 3"),
        (dict(d_model=12, n_heads=4), r"head_dim: expected an even int .*got 3"),
        (dict(d_model=12, n_heads=2, r_min=0.99, r_max=0.9), r"r_min, r_max: expected 0 < r_min <= r_max < 1"),
        (dict(d_model=12, n_heads=2, r_max=1.0), r"r_min, r_max"),
        (dict(d_model=0, n_heads=2), r"d_model: expected a positive int, got 0"),
        (dict(d_model=12, n_heads=2, conv_width=0), r"conv_width: expected a positive int"),
        (dict(d_model=12, n_heads=2, phase="dynamic"),
         r"phase: expected one of \['static', 'learned', 'carope', 'data', None\], got 'dynamic'"),
        (dict(d_model=12, n_heads=2, phase="data", phase_map="tanh"), r"phase_map: expected one of"),
        (dict(d_model=12, n_heads=2, selective=True, selective_gate="relu"),
         r"selective_gate: expected one of \['sigmoid', 'hardsigmoid'\], got 'relu'"),
        (dict(d_model=12, n_heads=2, selective_gate="hardsigmoid"),
         r"selective_gate: has no effect without selective=True, got 'hardsigmoid'"),
        (dict(d_model=12, n_heads=2, phase="carope", rotary=RotaryConfig(scaling={"rope_type": "linear", "factor": 2})),
         r"phase: CARoPE has no context-extension scaling"),
        (dict(d_model=12, n_heads=2, learnable_theta=True), r"learnable_theta: expected an option of RecurrenceConfig"),
        (dict(d_model=12, n_heads=2, norm_eps=-1.0), r"norm_eps: expected a number >= 0, got -1.0"),
        (dict(d_model=12, n_heads=2, phase_round=2), r"phase_round: applies to phase='data' only, got 2"),
        (dict(d_model=12, n_heads=2, phase="data", phase_round=1), r"phase_round: expected 0 \(off\) or an int >= 2"),
        (dict(d_model=12, n_heads=2, phase="data", phase_map="real-sign", phase_round=2),
         r"phase_round: has no effect with phase_map='real-sign'"),
        (dict(d_model=12, n_heads=2, phase="data", phase_round_at_inference=True),
         r"phase_round_at_inference: has no effect with phase_round=0"),
        (dict(d_model=12, n_heads=2, phase="data", phase_init="middle"), r"phase_init: expected one of"),
        (dict(d_model=12, n_heads=2, phase="static", phase_init="steepest"), r"phase_init: applies to phase='data'"),
        (dict(d_model=12, n_heads=2, phase="data", phase_map="real-sign", phase_init="steepest"),
         r"phase_init: expected 'schedule' with phase_map='real-sign'"),
        (dict(d_model=12, n_heads=2, readout_norm=1), r"readout_norm: expected True or False, got 1"),
        (dict(d_model=12, n_heads=2, rotary_dim=3), r"rotary_dim: expected an even int >= 2 \(rotary pairs\), at most "
                                                     r"head_dim=6, got 3"),
        (dict(d_model=12, n_heads=2, rotary_dim=8), r"rotary_dim: expected an even int .* at most head_dim=6, got 8"),
        (dict(d_model=12, n_heads=2, rotary_dim=0), r"rotary_dim: expected a positive int or None, got 0"),
        (dict(d_model=12, n_heads=2, rotary_dim=4, phase="data"),
         r"rotary_dim: applies to the 'static' and 'learned' phases, got 4 with phase='data'"),
        (dict(d_model=12, n_heads=2, rotary_dim=4, rotary=RotaryConfig(carope=True)),
         r"rotary_dim: applies to the 'static' and 'learned' phases, got 4 with phase='carope'"),
        (dict(d_model=12, n_heads=2, hold_below=0.1), r"hold_below: has no effect without selective=True, got 0.1"),
        (dict(d_model=12, n_heads=2, selective=True, hold_below=1.0), r"hold_below: expected a number in \[0, 1\)"),
    ],
)
def test_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VORecurrence(**kwargs)


def test_value_errors_at_call():
    m = make()
    with pytest.raises(ValueError, match=r"x: expected shape \(B, T, d_model=12\)"):
        m(torch.randn(2, 5, 10, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, d_model=12\)"):
        m.step(torch.randn(2, 1, 12, dtype=torch.float64), None)
    with pytest.raises(ValueError, match=r"state: expected a scan state of shape \(3, 3, 4\)"):
        m(torch.randn(3, 5, 12, dtype=torch.float64), m.init_state(2))
    with pytest.raises(ValueError, match=r"state: expected a RecurrenceState"):
        m(torch.randn(3, 5, 12, dtype=torch.float64), "state")
    assert isinstance(m.init_state(2), RecurrenceState)
