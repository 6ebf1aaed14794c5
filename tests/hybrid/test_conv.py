"""CausalConv1d: loop reference, continuation, short chunks, step, gradients, errors, backend dispatch."""
import sys
import types

import pytest
import torch

from hybrid import conv as conv_mod
from hybrid.conv import CausalConv1d, causal_conv1d_reference, select_conv_backend
from hybrid.kernels.causal_conv.fused import causal_conv1d_module  # cached import of the optional package

F64 = torch.float64


@pytest.fixture(autouse=True)
def _torch_backend_default(monkeypatch):
    monkeypatch.delenv(conv_mod.BACKEND_ENV, raising=False)
    causal_conv1d_module.cache_clear()
    yield
    causal_conv1d_module.cache_clear()


def loop_ref(x, weight, bias, tail):
    """y[t] = b + Σ_j weight[:, W−1−j] · x[t−j], where x[−i] = tail[W−1−i] (the W−1 inputs before x)."""
    B, T, C = x.shape
    W = weight.shape[1]
    y = torch.zeros(B, T, C, dtype=F64)
    for b in range(B):
        for t in range(T):
            for j in range(W):
                s = t - j
                v = x[b, s] if s >= 0 else tail[b, W - 1 + s]
                y[b, t] += weight[:, W - 1 - j] * v
            if bias is not None:
                y[b, t] += bias
    return y


def make(C=6, W=4, bias=True, seed=0):
    torch.manual_seed(seed)
    m = CausalConv1d(C, W, bias=bias).to(F64)
    with torch.no_grad():
        m.weight.normal_()
        if bias:
            m.bias.normal_()
    return m


@pytest.mark.parametrize("W,bias", [(4, True), (3, False), (1, True), (5, True)])
def test_matches_loop_reference(W, bias):
    m = make(C=6, W=W, bias=bias)
    x = torch.randn(2, 7, 6, dtype=F64)
    tail = torch.randn(2, W - 1, 6, dtype=F64)
    b = m.bias.detach() if bias else None
    for state in (None, tail):
        y, new = m(x, state)
        t0 = torch.zeros(2, W - 1, 6, dtype=F64) if state is None else state
        torch.testing.assert_close(y, loop_ref(x, m.weight.detach(), b, t0), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(new, torch.cat([t0, x], 1)[:, 7:], rtol=0, atol=0)
        y2, new2 = causal_conv1d_reference(x, m.weight.detach(), b, state)
        torch.testing.assert_close(y, y2, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(new, new2, rtol=0, atol=0)


@pytest.mark.parametrize("splits", [[5, 6], [1, 2, 1, 7], [2, 2, 2, 2, 3], [11]])
def test_continuation_and_short_chunks(splits):
    m = make(C=5, W=4)
    x = torch.randn(3, sum(splits), 5, dtype=F64)
    y_full, s_full = m(x)
    ys, state, t = [], None, 0
    for n in splits:  # chunks shorter than W−1 included
        y, state = m(x[:, t:t + n], state)
        ys.append(y)
        t += n
    torch.testing.assert_close(torch.cat(ys, 1), y_full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, s_full, rtol=0, atol=0)


def test_step_matches_forward_and_handoffs():
    m = make(C=7, W=4)
    x = torch.randn(2, 9, 7, dtype=F64)
    y_full, s_full = m(x)
    y_a, state = m(x[:, :2])  # T=2 < W−1, then steps, then forward again
    ys = [y_a]
    for t in range(2, 6):
        y_t, state = m.step(x[:, t], state)
        ys.append(y_t[:, None])
    y_b, state = m(x[:, 6:], state)
    ys.append(y_b)
    torch.testing.assert_close(torch.cat(ys, 1), y_full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, s_full, rtol=0, atol=0)
    y0, _ = m.step(x[:, 0], None)  # None = zeros
    torch.testing.assert_close(y0, y_full[:, 0], rtol=1e-12, atol=1e-12)
    assert torch.equal(m.init_state(2), torch.zeros(2, 3, 7))


class _Both(torch.nn.Module):
    """forward(x, tail) then step(2·x_last, state): both forms under one functional_call."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, tail):
        y, s = self.inner(x, tail)
        y2, s2 = self.inner.step(x[:, -1] * 2, s)
        return y, y2, s2


def test_gradcheck_forward_and_step():
    both = _Both(make(C=3, W=3))
    x = torch.randn(2, 4, 3, dtype=F64, requires_grad=True)
    tail = torch.randn(2, 2, 3, dtype=F64, requires_grad=True)
    w = both.inner.weight.detach().clone().requires_grad_()
    b = both.inner.bias.detach().clone().requires_grad_()

    def f(x, tail, w, b):
        return torch.func.functional_call(both, {"inner.weight": w, "inner.bias": b}, (x, tail))

    assert torch.autograd.gradcheck(f, (x, tail, w, b))


def test_dtype_kept_bf16():
    m = CausalConv1d(8, 4)
    x = torch.randn(2, 5, 8).bfloat16()
    y, s = m(x)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.bfloat16
    y1, s1 = m.step(x[:, 0], s)
    assert y1.dtype == torch.bfloat16 and s1.dtype == torch.bfloat16


def test_bad_args():
    with pytest.raises(ValueError, match="channels"):
        CausalConv1d(0)
    with pytest.raises(ValueError, match="width"):
        CausalConv1d(4, width=0)
    m = CausalConv1d(4, 3)
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(2, 0, 4))
    with pytest.raises(ValueError, match="conv_state"):
        m(torch.randn(2, 5, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="x"):
        m.step(torch.randn(2, 1, 4), None)
    with pytest.raises(ValueError, match="conv_state"):
        m.step(torch.randn(2, 4), torch.zeros(1, 2, 4))


# --- backend dispatch (no CUDA here: test the selection, and the call wiring with a fake package) -------


def _fake_causal_conv1d(calls):
    """A stand-in for the `causal_conv1d` package that checks the layouts the real kernels require."""

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                         return_final_states=False, final_states_out=None, activation=None):
        calls.append("fn")
        B, C, T = x.shape
        W = weight.shape[1]
        assert x.stride(1) == 1 and activation is None  # channel-last, as initial_states requires
        assert C % 8 == 0 and x.stride(0) % 8 == 0 and x.stride(2) % 8 == 0 and 2 <= W <= 4
        assert weight.shape == (C, W)
        if initial_states is None:
            tail = x.new_zeros(B, W - 1, C)
        else:
            assert initial_states.shape == (B, C, W - 1) and initial_states.stride(1) == 1
            tail = initial_states.transpose(1, 2)
        return loop_ref(x.transpose(1, 2), weight, bias, tail).to(x.dtype).transpose(1, 2)

    def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, **_):
        calls.append("update")
        B, C = x.shape
        assert conv_state.shape == (B, C, weight.shape[1] - 1) and activation is None
        y = loop_ref(x[:, None], weight, bias, conv_state.transpose(1, 2))[:, 0]
        conv_state.copy_(torch.cat([conv_state, x[:, :, None]], 2)[:, :, 1:])  # in place, like the kernel
        return y.to(x.dtype)

    return types.SimpleNamespace(causal_conv1d_fn=causal_conv1d_fn, causal_conv1d_update=causal_conv1d_update)


def test_selection_logic(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setitem(sys.modules, "causal_conv1d", None)  # import fails
    causal_conv1d_module.cache_clear()
    assert select_conv_backend(cuda, 16, 4, torch.float32) == "torch"

    monkeypatch.setitem(sys.modules, "causal_conv1d", _fake_causal_conv1d([]))
    causal_conv1d_module.cache_clear()
    assert select_conv_backend(cuda, 16, 4, torch.float32, torch.float32) == "causal_conv1d"
    assert select_conv_backend("cuda:0", 16, 2, torch.bfloat16) == "causal_conv1d"
    assert select_conv_backend("cpu", 16, 4, torch.float32) == "torch"  # only on CUDA
    assert select_conv_backend(cuda, 12, 4, torch.float32) == "torch"  # C % 8 != 0
    assert select_conv_backend(cuda, 16, 5, torch.float32) == "torch"  # W > 4
    assert select_conv_backend(cuda, 16, 1, torch.float32) == "torch"  # W < 2
    assert select_conv_backend(cuda, 16, 4, torch.float32, torch.float64) == "torch"
    monkeypatch.setenv(conv_mod.BACKEND_ENV, "torch")
    assert select_conv_backend(cuda, 16, 4, torch.float32) == "torch"
    monkeypatch.setenv(conv_mod.BACKEND_ENV, "bogus")
    with pytest.raises(ValueError, match=conv_mod.BACKEND_ENV):
        select_conv_backend(cuda, 16, 4, torch.float32)


def test_fused_call_wiring(monkeypatch):
    """With the fused backend selected (faked on CPU), forward/step give the torch path's numbers."""
    calls = []
    monkeypatch.setitem(sys.modules, "causal_conv1d", _fake_causal_conv1d(calls))
    causal_conv1d_module.cache_clear()
    m = make(C=8, W=4)
    x = torch.randn(2, 8, 8, dtype=F64)
    y_ref, s_ref = m(x)
    assert calls == []  # CPU: torch path
    monkeypatch.setattr(conv_mod, "select_conv_backend", lambda *a: "causal_conv1d")
    y_a, s = m(x[:, :2])  # T < W−1, no incoming state
    y_b, s = m(x[:, 2:5], s)  # with initial_states
    with torch.no_grad():
        s_before = s.clone()
        y_c, s2 = m.step(x[:, 5], s)
        assert torch.equal(s, s_before)  # the caller's state is not mutated
        y_d, s2 = m.step(x[:, 6], s2)
    y_e, s2 = m(x[:, 7:], s2)
    assert calls == ["fn", "fn", "update", "update", "fn"]
    y = torch.cat([y_a, y_b, y_c[:, None], y_d[:, None], y_e], 1)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2, s_ref, rtol=0, atol=0)
    m.step(x[:, 0].requires_grad_(), s)  # needs grad: the update kernel (no autograd) is skipped
    assert calls[-1] == "fn"
