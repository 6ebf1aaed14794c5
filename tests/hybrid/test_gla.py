"""The G mixer (hybrid/gla.py): its three modes agree across hand-offs, packed equals separate, chunked prefill at
every chunk length, gradients to every parameter, its options and their errors; all in float64.

The op underneath is checked against its formula in tests/kernels/test_vo_gla.py; the context-parallel path on 2
and 3 ranks in tests/kernels/context_parallel.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from hybrid import GLAConfig, GLAState, VOGatedLinearAttention
from hybrid.kernels.context_parallel import shard_sequence
from hybrid.kernels.vo_gla import vo_gla_reference
from hybrid.models import HybridConfig, HybridLM

F64 = torch.float64
D_MODEL, HEADS = 20, 2
OPTIONS = {
    "selective, static phase": {},
    "static decay, learned phase, partial rotary": {"decay": "static", "phase": "learned", "rotary_dim": 4},
    "data phase, rounded": {"phase": "data", "phase_round": 4, "phase_round_at_inference": True},
    "no conv, own key and value sizes, no output norm": {"conv_width": 0, "key_dim": 3, "value_dim": 6, "tile_size": 3,
                                                         "output_norm": False},
    # gates near 1/2 at random weights: a threshold there shuts about half of them (γ_t = 1) and leaves the rest open
    "hard gate held below 0.45, data phase": {"gate": "hardsigmoid", "hold_below": 0.45, "phase": "data"},
}
_seed = itertools.count(4646)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Tiny tensors: a second thread only contends (tests/conftest.py)."""


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def mixer(**options) -> VOGatedLinearAttention:
    torch.manual_seed(next(_seed))
    m = VOGatedLinearAttention(D_MODEL, HEADS, tile_size=options.pop("tile_size", 4), **options).double()
    with torch.no_grad():  # leave the init's special points (θ on the schedule, W_decay = 0): a generic layer
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen(), dtype=F64))
    return m


def x_of(B, T) -> torch.Tensor:
    return torch.randn(B, T, D_MODEL, generator=gen(), dtype=F64)


def assert_close(got, want, tol=1e-12):
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_the_three_modes_agree_across_hand_offs(options):
    """Parallel over all of x equals: a parallel prefix, then steps, then chunks continuing the state; and steps
    from the start. Outputs and final states (S and the conv tail)."""
    m = mixer(**options).eval()
    x = x_of(2, 17)
    want, final = m(x)
    y1, s = m(x[:, :5])  # parallel prefix (at a chunk edge and a half)
    ys = [y1]
    for t in range(5, 9):  # steps
        y_t, s = m.step(x[:, t], s, offset=t)
        ys.append(y_t[:, None])
    for a, b in ((9, 10), (10, 16), (16, 17)):  # chunks of 1, 6 and 1 tokens continuing it
        y, s = m(x[:, a:b], s, offset=a)
        ys.append(y)
    assert_close(torch.cat(ys, 1), want)
    assert_close(s.S, final.S) and assert_close(s.conv, final.conv)
    s, steps = None, []
    for t in range(17):
        y_t, s = m.step(x[:, t], s, offset=t)
        steps.append(y_t)
    assert_close(torch.stack(steps, 1), want)
    assert_close(s.S, final.S)


def test_chunked_prefill_at_every_chunk_length():
    """A model with G layers (GGA: window attention too): chunked mode at every chunk length, then decoding from
    that state, equals the parallel forward."""
    config = HybridConfig(vocab_size=31, d_model=D_MODEL, n_heads=HEADS, n_layers=3, pattern="GGA", window=5,
                          dtype="float64", **{"gla.tile_size": 3})
    torch.manual_seed(0)
    model = HybridLM(config).eval()
    ids = torch.randint(0, 31, (2, 11), generator=gen())
    with torch.no_grad():
        want, _ = model(ids)
        for chunk in range(1, 11):
            got, state = model(ids[:, :9], mode="chunked", chunk_size=chunk)
            tail, _ = model(ids[:, 9:], mode="recurrent", state=state)
            assert_close(torch.cat([got, tail], 1), want)


@pytest.mark.parametrize("options", [{}, {"phase": "data", "decay": "static"}, {"conv_width": 0},
                                     {"gate": "hardsigmoid", "hold_below": 0.45}])
def test_packed_equals_separate(options):
    """A packed batch (lengths 1 and 2, across the op's chunk edges) with per-sequence states and positions equals
    each sequence run alone: outputs, states and the gradients of every parameter and of the input."""
    m = mixer(**options)
    lens = [1, 5, 2, 4, 9]
    cu = torch.tensor([0, *itertools.accumulate(lens)])
    heads = [x_of(1, n) for n in (3, 0, 2, 1, 4)]
    with torch.no_grad():
        states = [m(h)[1] if h.shape[1] else None for h in heads]
    x = x_of(1, sum(lens)).requires_grad_()
    weights = torch.randn(1, sum(lens), D_MODEL, generator=gen(), dtype=F64)
    y, out_states = m(x, states, offset=[h.shape[1] for h in heads], cu_seqlens=cu)
    grads = torch.autograd.grad((y * weights).sum() + sum(s.S.sum() for s in out_states), [x, *m.parameters()])
    ys, separate_states = [], []
    for (a, b), st, h in zip(itertools.pairwise(cu.tolist()), states, heads):
        y_n, s_n = m(x[:, a:b], st, offset=h.shape[1])
        ys.append(y_n)
        separate_states.append(s_n)
    want = torch.autograd.grad((torch.cat(ys, 1) * weights).sum() + sum(s.S.sum() for s in separate_states),
                               [x, *m.parameters()])
    assert_close(y, torch.cat(ys, 1))
    for s, w in zip(out_states, separate_states):
        assert_close(s.S, w.S) and assert_close(s.conv, w.conv)
    for g, w in zip(grads, want):
        assert_close(g, w)


@pytest.mark.parametrize("cu", [None, [0, 3, 9, 10, 14]])
def test_a_one_rank_shard_is_the_plain_forward_and_takes_no_state(cu):
    """``forward(x, shard=…)`` with the whole sequence on one rank is the plain forward (the numbers on 2 and 3
    ranks: tests/kernels/context_parallel); a shard takes no state in and builds none."""
    m = mixer(phase="data")
    cu = None if cu is None else torch.tensor(cu)
    x = x_of(1 if cu is not None else 2, 14)
    shard = shard_sequence(14, cu_seqlens=cu)
    want, _ = m(x, cu_seqlens=cu, output_final_state=False)
    got, state = m(x, shard=shard, output_final_state=False)
    assert state is None and torch.equal(got, want)
    with pytest.raises(ValueError, match=r"^output_final_state: expected False with shard="):
        m(x, shard=shard)
    with pytest.raises(ValueError, match=r"^state: expected None with shard="):
        m(x, m.init_state(x.shape[0]), shard=shard, output_final_state=False)


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_gradients_reach_every_parameter_and_equal_the_recurrent_ones(options):
    """The chunkwise op's backward against autograd through the one-token steps: every parameter (and x)."""
    m = mixer(**options).train()
    x = x_of(2, 9).requires_grad_()
    weights = torch.randn(2, 9, D_MODEL, generator=gen(), dtype=F64)
    params = [x, *m.parameters()]
    y, _ = m(x, output_final_state=False)
    got = torch.autograd.grad((y * weights).sum(), params)
    s, steps = None, []
    for t in range(9):
        y_t, s = m.step(x[:, t], s, offset=t)
        steps.append(y_t)
    want = torch.autograd.grad((torch.stack(steps, 1) * weights).sum(), params)
    for (name, _), g, w in zip([("x", x), *m.named_parameters()], got, want):
        assert g.abs().max() > 0, name  # every parameter takes part
        assert_close(g, w, 1e-11)


def test_the_state_holds_no_position():
    """The rotation is relative: the same tokens at another offset give the same outputs; the state is S and
    the conv tail only, of a fixed size."""
    m = mixer(phase="static")
    x = x_of(1, 7)
    assert_close(m(x, offset=0)[0], m(x, offset=1000)[0])
    state = m(x)[1]
    assert {f for f in GLAState.__dataclass_fields__} == {"conv", "S"}
    assert state.nbytes == 3 * 2 * HEADS * 10 * 8 + HEADS * 10 * 10 * 8  # conv tail (float64 here) + S
    assert state.nbytes == m(x_of(1, 30))[1].nbytes
    assert GLAState.cat([state, state]).S.shape[0] == 2 and state.clone() is state


def test_the_init_starts_on_retnets_schedule_and_static_vo_rope():
    """Selective decays start at γ_h = 1 − 2^{−5−h} at every token; data angles start at the static schedule."""
    m = VOGatedLinearAttention(16, 4, phase="data").double()
    x = torch.randn(2, 3, 16, dtype=F64)
    want = torch.log1p(-torch.exp2(-5.0 - torch.arange(4, dtype=F64)))
    assert_close(m.log_decay(x), want.expand(2, 3, 4), 1e-6)  # the gate's bias was stored in float32
    assert_close(m.angles(x), m.theta.double().expand(2, 3, 4, 2), 1e-6)  # float32 schedule
    static = VOGatedLinearAttention(16, 4, decay="static")
    torch.testing.assert_close(static.log_decay(x.float()), want.float())
    hard = VOGatedLinearAttention(16, 4, gate="hardsigmoid").double()
    assert_close(hard.log_decay(x), want.expand(2, 3, 4), 1e-6)  # c·(1/2)·log γ_h, γ_h stored in float32


def test_the_hard_gate_holds_the_state_exactly():
    """With gate="hardsigmoid" a gate at 0 (z ≤ −3, or below hold_below) gives log γ_t = 0 exactly, so the
    state is kept whole: S_t = S_{t−1} turned, plus the write. A held gate's gradient is r's (straight-through):
    d log γ_t / d b_h = c · hardsigmoid'(z) · log γ_h = (8/6) log γ_h inside (−3, 3), and 0 past it."""
    m = mixer(gate="hardsigmoid", hold_below=0.25)
    x = x_of(1, 6)
    with torch.no_grad():
        m.decay_weight.zero_()
        m.decay_bias.copy_(torch.tensor([-5.0, -1.0]))  # r = 0 (hard zero), r = 1/3 (open)
    log_decay = m.log_decay(x)
    assert torch.equal(log_decay[..., 0], torch.zeros(1, 6, dtype=F64))
    log_gamma_h = -torch.exp(m.decay_nu.detach())
    assert_close(log_decay[..., 1], (8 / 3 * log_gamma_h[1]).expand(1, 6))
    with torch.no_grad():
        m.decay_bias.copy_(torch.tensor([-2.0, -1.0]))  # r = 1/6: below 0.25, held (straight-through)
    log_decay = m.log_decay(x)
    assert torch.equal(log_decay[..., 0], torch.zeros(1, 6, dtype=F64))
    (grad,) = torch.autograd.grad(log_decay.sum(), [m.decay_bias])
    assert_close(grad, 6 * 8 / 6 * log_gamma_h, 1e-7)  # six tokens; torch's hardsigmoid backward takes 1/6 in fp32
    # every head held over the whole sequence: the layer's state is the op's with γ = 1, every write kept whole
    with torch.no_grad():
        m.decay_bias.fill_(-5.0)
        _, state = m(x)
        q, k, _ = m._keys(x, None)
        v = m.v_proj(x).unflatten(-1, (HEADS, m.value_dim))  # (1, T, H, Dv)
        _, want = vo_gla_reference(q, k, v, torch.zeros(HEADS, dtype=F64), m.theta.double(), output_final_state=True)
    assert_close(state.S, want)


def test_options_and_their_errors():
    assert GLAConfig() == GLAConfig(decay="selective", phase="static", conv_width=4)
    assert (GLAConfig.state_grows, GLAConfig.cheap_to_recompute) == (False, True)
    cases = [
        (dict(decay="dynamic"), r"^decay: expected one of \['static', 'selective'\], got 'dynamic'$"),
        (dict(gate="relu"), r"^gate: expected one of \['logsigmoid', 'hardsigmoid'\], got 'relu'$"),
        (dict(decay="static", gate="hardsigmoid"),
         r"^gate: applies to decay='selective' only, got 'hardsigmoid' with decay='static'$"),
        (dict(hold_below=0.25), r"^hold_below: applies to gate='hardsigmoid' only, got 0.25 with gate='logsigmoid'$"),
        (dict(gate="hardsigmoid", hold_below=1.0), r"^hold_below: expected a number in \[0, 1\), got 1.0$"),
        (dict(phase="carope"), r"^phase: expected one of \['static', 'learned', 'data'\], got 'carope'$"),
        (dict(phase_round=4), r"^phase_round: applies to phase='data' only, got 4 with phase='static'$"),
        (dict(phase="data", rotary_dim=2), r"^rotary_dim: applies to the 'static' and 'learned' phases, got 2"),
        (dict(value_dim=5), r"^value_dim: expected an even int >= 2 \(rotary pairs\), got 5$"),
        (dict(conv_width=-1), r"^conv_width: expected 0 \(no conv\) or a positive int, got -1$"),
        (dict(tile_size=0), r"^tile_size: expected a positive int, got 0$"),
        (dict(output_norm=0), r"^output_norm: expected True or False, got 0$"),
    ]
    for options, match in cases:
        with pytest.raises(ValueError, match=match):
            GLAConfig(**options)
    with pytest.raises(ValueError, match=r"^gla.rotary_dim: expected an even int >= 2 \(rotary pairs\), at most the "
                                         r"value size=8, got 10$"):
        HybridConfig(d_model=16, n_heads=2, pattern="G", **{"gla.rotary_dim": 10})
    with pytest.raises(ValueError, match=r"^head_dim: expected an even int >= 2 \(rotary pairs\), got 3$"):
        HybridConfig(d_model=9, n_heads=3, pattern="G")
    assert HybridConfig(d_model=9, n_heads=3, pattern="G", **{"gla.value_dim": 4}).gla.value_dim == 4
    with pytest.raises(ValueError, match=r"^state: expected a GLAState or None, got dict$"):
        VOGatedLinearAttention(16, 2)(torch.randn(1, 3, 16), {})


def test_the_preset_and_the_pattern_letter():
    c = HybridConfig.preset("vo-gla")
    assert c.layer_types == "GGGG" and c.state_is_fixed and c.meta["preset"] == "vo-gla"
    hybrid = HybridConfig.preset("hybrid", pattern="GGA", window=8)
    model = HybridLM(hybrid)
    assert [type(b.mixer).__name__ for b in model.blocks] == ["VOGatedLinearAttention"] * 2 + ["Attention"] * 1 + [
        "VOGatedLinearAttention"]
    assert HybridConfig.from_dict(c.to_dict()) == c and c.to_dict()["gla"]["decay"] == "selective"


def test_fullgraph_compile_of_a_g_model_equals_eager():
    torch.compiler.reset()
    config = HybridConfig.preset("vo-gla", "tiny", d_model=16, n_layers=2, n_heads=2, vocab_size=32,
                                 **{"gla.phase": "data", "gla.tile_size": 4})
    torch.manual_seed(0)
    model = HybridLM(config).double().train()
    ids = torch.randint(0, 32, (2, 11))

    def loss_and_grads(fn):
        logits = fn(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        return [logits.detach(), *torch.autograd.grad(loss, list(model.parameters()))]

    compiled = torch.compile(lambda i: model(i, output_final_state=False)[0], fullgraph=True, backend="aot_eager")
    for got, want in zip(loss_and_grads(compiled), loss_and_grads(lambda i: model(i, output_final_state=False)[0])):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    torch.compiler.reset()
