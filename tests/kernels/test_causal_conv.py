"""causal_conv1d: packed equals separate (outputs, final states, gradients), continuation, step, padding, errors.

Every form is compared with the loop reference in float64, each sequence run alone; the reference itself is
checked against the definition read literally. The `causal_conv1d` package (CUDA only) is replaced by a stand-in
that enforces its layout and argument rules, so its wiring (seq_idx, initial_states, the stream of tails) runs
on CPU.
"""
from __future__ import annotations

import itertools
import random
import sys
import types

import pytest
import torch

from hybrid.conv import CausalConv1d
from hybrid.kernels import causal_conv1d, causal_conv1d_reference, causal_conv1d_step
from hybrid.kernels.causal_conv import fused, interface

F64 = torch.float64
_seed = itertools.count(2024)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


@pytest.fixture(autouse=True)
def _no_package(monkeypatch):
    """Tests start from the package's real absence here (and any env override removed)."""
    monkeypatch.delenv(interface.BACKEND_ENV, raising=False)
    fused.causal_conv1d_module.cache_clear()
    yield
    fused.causal_conv1d_module.cache_clear()


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)])


def make(lengths, C, W, init=True, bias=True, grad=True):
    """x (1, Σ lengths, C), weight (C, W), bias (C,), initial_state (N, W−1, C) or None, cu_seqlens."""
    g = torch.Generator().manual_seed(next(_seed))
    x = torch.randn(1, sum(lengths), C, generator=g, dtype=F64)
    w = torch.randn(C, W, generator=g, dtype=F64)
    b = torch.randn(C, generator=g, dtype=F64) if bias else None
    h = torch.randn(len(lengths), W - 1, C, generator=g, dtype=F64) if init else None
    leaves = [t.requires_grad_(grad) if t is not None else None for t in (x, w, b, h)]
    return (*leaves, offsets(lengths))


def definition(x, weight, bias, tail):
    """y[t] = b + Σ_j weight[:, W−1−j] · x[t−j], x[−i] = tail[W−1−i]: one row, (T, C)."""
    T, C = x.shape
    W = weight.shape[1]
    y = torch.zeros(T, C, dtype=F64)
    for t in range(T):
        for j in range(W):
            y[t] += weight[:, W - 1 - j] * (x[t - j] if t - j >= 0 else tail[W - 1 + t - j])
        if bias is not None:
            y[t] += bias
    return y


def separate(x, w, b, h, cu):
    """Each sequence alone (B = 1) through the reference: y (1, T, C), finals (N, W−1, C)."""
    ys, finals = [], []
    bounds = cu.tolist()
    for n in range(len(bounds) - 1):
        y, f = causal_conv1d_reference(x[:, bounds[n]:bounds[n + 1]], w, b, None if h is None else h[n:n + 1],
                                       output_final_state=True)
        ys.append(y)
        finals.append(f)
    return torch.cat(ys, 1), torch.cat(finals, 0)


def assert_close_grads(outs, refs, inputs):
    go = [torch.randn_like(r) for r in refs]
    live = [t for t in inputs if t is not None]
    got = torch.autograd.grad(outs, live, go, allow_unused=True)
    want = torch.autograd.grad(refs, live, go, allow_unused=True)
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------- reference
def test_reference_is_the_definition():
    x, w, b, h, cu = make([5, 1, 2, 7], 3, 4, grad=False)
    y, final = causal_conv1d_reference(x, w, b, h, output_final_state=True, cu_seqlens=cu)
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        torch.testing.assert_close(y[0, s:e], definition(x[0, s:e], w, b, h[n]), rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(final[n], torch.cat([h[n], x[0, s:e]])[-3:], rtol=0, atol=0)
    y, final = causal_conv1d_reference(x.expand(2, -1, -1), w, None, h[:2], output_final_state=True)
    for r in range(2):
        torch.testing.assert_close(y[r], definition(x[0], w, None, h[r]), rtol=1e-13, atol=1e-13)


# -------------------------------------------------------------------------------- packed = separate
@pytest.mark.parametrize("init", [False, True], ids=["zeros", "initial_state"])
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_packed_equals_separate_with_gradients(backend, W, init):
    rng = random.Random(f"{backend}{W}{init}")
    lengths = [rng.randint(1, 9) for _ in range(5)] + [1, 2, 1, 2]  # 1- and 2-token documents (fla #1140)
    rng.shuffle(lengths)
    x, w, b, h, cu = make(lengths, 6, W, init=init)
    y, final = causal_conv1d(x, w, b, h, output_final_state=True, cu_seqlens=cu, backend=backend)
    y_ref, final_ref = separate(x, w, b, h, cu)
    torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=0)
    assert_close_grads([y, final], [y_ref, final_ref], [x, w, b, h])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5])
def test_packed_taps_equal_separate_with_gradients(W, bias):
    """The form torch.compile takes for packed training (zero states, no final state): W shifted, masked products,
    shapes independent of N; every sequence as the reference gives it alone, with gradients."""
    from hybrid.kernels.causal_conv.depthwise import packed_taps

    rng = random.Random(f"taps{W}{bias}")
    lengths = [rng.randint(1, 9) for _ in range(5)] + [1, 2, 1, 2]
    rng.shuffle(lengths)
    x, w, b, _, cu = make(lengths, 6, W, init=False, bias=bias)
    y = packed_taps(x, w, b, cu)
    y_ref, _ = separate(x, w, b, None, cu)
    torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    assert_close_grads([y], [y_ref], [x, w, b])


def test_compiled_packed_conv_builds_one_graph_for_every_document_count():
    """Under torch.compile (Inductor: the specialisation happened in its lowering, which a tracing-only backend
    does not run) the packed training conv's shapes do not depend on N: the stream form's total + N·(W−1) slots
    gave the conv-backward lowering a size to fix, one graph per document count. Outputs and gradients equal the
    reference; one graph over N = 2, 3, 4 documents of 24 tokens."""
    import torch._dynamo.utils

    def conv(x, w, b, cu):
        return causal_conv1d(x, w, b, cu_seqlens=cu, backend="torch")[0]

    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(conv)
    for lengths in ([10, 14], [5, 11, 8], [1, 9, 2, 12]):
        x, w, b, _, cu = make(lengths, 4, 4, init=False)
        torch._dynamo.maybe_mark_dynamic(cu, 0)
        y = compiled(x, w, b, cu)
        y_ref, _ = separate(x, w, b, None, cu)
        torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
        assert_close_grads([y], [y_ref], [x, w, b])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch.compiler.reset()


def test_unpacked_batch_equals_rows():
    x, w, b, h, _ = make([7], 5, 4)
    xb = torch.cat([x, x.flip(1) * 0.5, x * 2], 0).detach().requires_grad_()  # (3, 7, 5)
    hb = torch.cat([h, -h, h * 0], 0).detach().requires_grad_()  # (3, 3, 5)
    y, final = causal_conv1d(xb, w, b, hb, output_final_state=True)
    y_ref, final_ref = causal_conv1d_reference(xb, w, b, hb, output_final_state=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=0)
    assert_close_grads([y, final], [y_ref, final_ref], [xb, w, b, hb])


def test_gradcheck_packed_short_documents():
    """The torch path's gradients by finite differences, documents of 1, 2 and 3 tokens (W = 4)."""
    x, w, b, h, cu = make([1, 2, 3, 1], 2, 4)

    def f(x, w, b, h):
        return causal_conv1d(x, w, b, h, output_final_state=True, cu_seqlens=cu, backend="torch")

    assert torch.autograd.gradcheck(f, (x, w, b, h))


def test_no_final_state_when_not_asked():
    x, w, b, h, cu = make([3, 4], 4, 3, grad=False)
    assert causal_conv1d(x, w, b, h, cu_seqlens=cu)[1] is None
    assert causal_conv1d(x, w, b)[1] is None


# ------------------------------------------------------------------------------------- continuation
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("init", [False, True], ids=["zeros", "initial_state"])
def test_continuation_at_every_split(W, init):
    """A 7-token sequence cut at every point (and in three at every pair of points) equals one call."""
    x, w, b, h, _ = make([7], 3, W, init=init, grad=False)
    y_full, s_full = causal_conv1d(x, w, b, h, output_final_state=True)
    for cuts in itertools.chain(itertools.combinations(range(1, 7), 1), itertools.combinations(range(1, 7), 2)):
        ys, state, bounds = [], h, (0, *cuts, 7)
        for s, e in zip(bounds, bounds[1:]):
            y, state = causal_conv1d(x[:, s:e], w, b, state, output_final_state=True)
            ys.append(y)
        torch.testing.assert_close(torch.cat(ys, 1), y_full, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(state, s_full, rtol=0, atol=0)


def test_packed_continuation_per_sequence_states():
    """Packed chunks continued from the previous packed call's per-sequence final states equal one call."""
    lengths = [5, 1, 2, 8, 3]
    x, w, b, h, cu = make(lengths, 4, 4, grad=False)
    y_full, s_full = causal_conv1d(x, w, b, h, output_final_state=True, cu_seqlens=cu)
    rng = random.Random(1)
    for _ in range(6):
        first = [rng.randint(1, n - 1) if n > 1 else None for n in lengths]
        keep = [n for n, f in enumerate(first) if f is not None]  # sequences with a token on each side
        parts = [[], []]
        for n in keep:
            s, e = cu[n].item(), cu[n + 1].item()
            parts[0].append(x[:, s:s + first[n]])
            parts[1].append(x[:, s + first[n]:e])
        cu_a = offsets([first[n] for n in keep])
        cu_b = offsets([lengths[n] - first[n] for n in keep])
        y_a, mid = causal_conv1d(torch.cat(parts[0], 1), w, b, h[keep], output_final_state=True, cu_seqlens=cu_a)
        y_b, end = causal_conv1d(torch.cat(parts[1], 1), w, b, mid, output_final_state=True, cu_seqlens=cu_b)
        for i, n in enumerate(keep):
            s, e = cu[n].item(), cu[n + 1].item()
            got = torch.cat([y_a[:, cu_a[i]:cu_a[i + 1]], y_b[:, cu_b[i]:cu_b[i + 1]]], 1)
            torch.testing.assert_close(got, y_full[:, s:e], rtol=1e-13, atol=1e-13)
            torch.testing.assert_close(end[i], s_full[n], rtol=0, atol=0)


@pytest.mark.parametrize("W", [1, 3, 4])
def test_step_by_step_equals_the_op(W):
    x, w, b, h, _ = make([6], 5, W, grad=False)
    xb, hb = torch.cat([x, -x], 0), torch.cat([h, h * 3], 0)  # (2, 6, 5), (2, W−1, 5)
    y_full, s_full = causal_conv1d(xb, w, b, hb, output_final_state=True)
    state, ys = hb, []
    for t in range(6):
        y_t, state = causal_conv1d_step(xb[:, t], w, b, state)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y_full, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state, s_full, rtol=0, atol=0)
    y0, _ = causal_conv1d_step(xb[:, 0], w, None, None)  # None: zeros
    torch.testing.assert_close(y0, causal_conv1d(xb[:, :1], w)[0][:, 0], rtol=1e-13, atol=1e-13)


def test_padding_document_changes_nothing_else():
    """Padding packed as its own sequence: the real sequences' outputs, states and gradients are unchanged,
    and no gradient reaches the padding from the real outputs."""
    x, w, b, h, cu = make([4, 1, 6], 3, 4)
    pad = torch.full((1, 5, 3), 7.0, dtype=F64, requires_grad=True)
    xp = torch.cat([x, pad], 1)
    cu_p = torch.cat([cu, cu[-1:] + 5])
    hp = torch.cat([h, torch.full((1, 3, 3), -3.0, dtype=F64)], 0)
    y, final = causal_conv1d(x, w, b, h, output_final_state=True, cu_seqlens=cu)
    yp, final_p = causal_conv1d(xp, w, b, hp, output_final_state=True, cu_seqlens=cu_p)
    T = x.shape[1]
    torch.testing.assert_close(yp[:, :T], y, rtol=0, atol=0)
    torch.testing.assert_close(final_p[:3], final, rtol=0, atol=0)
    go = torch.randn_like(y)
    g = torch.autograd.grad(y, (x, w, b, h), go)
    gp = torch.autograd.grad(yp[:, :T], (x, w, b, h, pad), go)
    for a, r in zip(gp, g):
        torch.testing.assert_close(a, r, rtol=1e-13, atol=1e-13)
    assert gp[-1].abs().max() == 0


def test_dtype_kept_bf16():
    x = torch.randn(1, 9, 8).bfloat16()
    w = torch.randn(8, 4)
    y, final = causal_conv1d(x, w, torch.randn(8), output_final_state=True, cu_seqlens=offsets([2, 7]))
    assert y.dtype == final.dtype == torch.bfloat16 and final.shape == (2, 3, 8)
    y_t, s_t = causal_conv1d_step(x[0, :2], w, None, final)
    assert y_t.dtype == s_t.dtype == torch.bfloat16


def test_empty_input():
    x, w, b, h, _ = make([3], 4, 3, grad=False)
    y, final = causal_conv1d(x[:, :0], w, b, h, output_final_state=True)
    assert y.shape == (1, 0, 4) and torch.equal(final, h)
    no_rows = torch.randn(0, 5, 8, dtype=torch.float64)  # an empty batch: the op and its reference alike
    for conv in (causal_conv1d, causal_conv1d_reference):
        y, final = conv(no_rows, torch.randn(8, 4, dtype=torch.float64), output_final_state=True)
        assert y.shape == (0, 5, 8) and final.shape == (0, 3, 8), conv.__name__


# --------------------------------------------------------------------------------------- the module
def test_module_packed_and_output_final_state():
    m = CausalConv1d(6, 4).double()
    x, _, _, h, cu = make([3, 1, 5], 6, 4, grad=False)
    y, state = m(x, h, cu_seqlens=cu)
    y_ref, s_ref = separate(x, m.weight, m.bias, h, cu)
    torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(state, s_ref, rtol=0, atol=0)
    y2, none = m(x, h, cu_seqlens=cu, output_final_state=False)
    assert none is None and torch.equal(y2, y)
    with pytest.raises(ValueError, match=r"^conv_state: expected shape \(3, 3, 6\)"):
        m(x, h[:2], cu_seqlens=cu)


# ------------------------------------------------------------------------ the package, stood in for
def _stand_in(calls):
    """`causal_conv1d` as documented (≥ 1.4): channel-last x (B, C, T); seq_idx (B, T) int32 excludes
    initial_states and return_final_states; initial_states (B, C, W−1); update mutates its state."""

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):
        B, C, T = x.shape
        W = weight.shape[1]
        assert x.stride(1) == 1 and activation is None and not return_final_states and 2 <= W <= 4 and C % 8 == 0
        if seq_idx is not None:
            assert initial_states is None and seq_idx.dtype == torch.int32 and seq_idx.shape == (B, T)
        calls.append("fn" if seq_idx is None else "fn+seq_idx")
        tails = x.new_zeros(B, C, W - 1) if initial_states is None else initial_states
        ids = torch.zeros(B, T, dtype=torch.int32) if seq_idx is None else seq_idx
        y = torch.zeros(B, C, T, dtype=F64)
        for r in range(B):
            for t in range(T):
                acc = torch.zeros(C, dtype=F64) if bias is None else bias.double().clone()
                for j in range(W):
                    s = t - j
                    if s >= 0 and ids[r, s] == ids[r, t]:
                        acc = acc + weight[:, W - 1 - j] * x[r, :, s]
                    elif s < 0 and seq_idx is None:
                        acc = acc + weight[:, W - 1 - j] * tails[r, :, W - 1 + s]
                y[r, :, t] = acc
        return y.to(x.dtype)

    def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, **_):
        calls.append("update")
        window = torch.cat([conv_state, x[:, :, None]], 2)  # (B, C, W)
        y = torch.einsum("bcw,cw->bc", window, weight) + (0 if bias is None else bias)
        conv_state.copy_(window[:, :, 1:])
        return y

    return types.SimpleNamespace(causal_conv1d_fn=causal_conv1d_fn, causal_conv1d_update=causal_conv1d_update)


@pytest.mark.parametrize("init", [False, True], ids=["seq_idx", "stream_of_tails"])
def test_fused_wiring_packed(monkeypatch, init):
    calls = []
    monkeypatch.setitem(sys.modules, "causal_conv1d", _stand_in(calls))
    fused.causal_conv1d_module.cache_clear()
    x, w, b, h, cu = make([3, 1, 2, 6], 8, 4, init=init)
    y, final = causal_conv1d(x, w, b, h, output_final_state=True, cu_seqlens=cu, backend="causal_conv1d")
    y_ref, final_ref = separate(x, w, b, h, cu)
    torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=0)
    assert calls == ["fn" if init else "fn+seq_idx"]
    y2, none = causal_conv1d(x, w, b, h, cu_seqlens=cu, backend="causal_conv1d")
    assert none is None and torch.equal(y2, y)


def test_fused_wiring_unpacked_and_step(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "causal_conv1d", _stand_in(calls))
    fused.causal_conv1d_module.cache_clear()
    x, w, b, h, _ = make([5], 8, 3, grad=False)
    for state in (None, h):
        y, final = causal_conv1d(x[:, :1], w, b, state, output_final_state=True, backend="causal_conv1d")  # T < W−1
        y_ref, final_ref = causal_conv1d_reference(x[:, :1], w, b, state, output_final_state=True)
        torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(final, final_ref, rtol=0, atol=0)
    before = h.clone()
    y_t, s_t = causal_conv1d_step(x[:, 0], w, b, h, backend="causal_conv1d")
    assert torch.equal(h, before)  # the caller's state is not mutated
    y_ref, s_ref = causal_conv1d_reference(x[:, :1], w, b, h, output_final_state=True)
    torch.testing.assert_close(y_t, y_ref[:, 0], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(s_t, s_ref, rtol=0, atol=0)
    causal_conv1d_step(x[:, 0].requires_grad_(), w, b, h, backend="causal_conv1d")  # needs grad: torch
    assert calls == ["fn", "fn", "update"]


def test_auto_choice(monkeypatch):
    assert interface.select_conv_backend("cpu", 16, 4, torch.float32) == "torch"
    assert interface.resolve_conv_backend(None, torch.zeros(1, 2, 8), torch.zeros(8, 4)) == "torch"
    monkeypatch.setitem(sys.modules, "causal_conv1d", _stand_in([]))
    fused.causal_conv1d_module.cache_clear()
    assert interface.select_conv_backend("cuda", 16, 4, torch.bfloat16, torch.float32) == "causal_conv1d"
    assert interface.select_conv_backend("cuda", 16, 4, torch.float64) == "torch"
    monkeypatch.setenv(interface.BACKEND_ENV, "torch")
    assert interface.select_conv_backend("cuda", 16, 4, torch.float32) == "torch"


# ------------------------------------------------------------------------------------------- errors
def _call(**over):
    x, w, b, h, cu = make([3, 2, 4], 4, 3, grad=False)
    args = dict(x=x, weight=w, bias=b, initial_state=h, cu_seqlens=cu)
    args.update(over)
    return causal_conv1d(args.pop("x"), args.pop("weight"), args.pop("bias"), args.pop("initial_state"), **args)


@pytest.mark.parametrize(
    "over,message",  # the offsets' own checks are the shared ones of hybrid.kernels.varlen: matched loosely
    [
        (dict(cu_seqlens=torch.tensor([[0, 3, 5, 9]])), r"^cu_seqlens: expected a 1-D .*got shape \(1, 4\)"),
        (dict(cu_seqlens=torch.tensor([0.0, 3, 5, 9])), r"^cu_seqlens: expected an int.*got torch.float32"),
        (dict(cu_seqlens=torch.tensor([0, 3, 5, 9], device="meta")), r"^cu_seqlens: expected a tensor on cpu"),
        (dict(cu_seqlens=torch.tensor([1, 3, 5, 9])), r"^cu_seqlens: expected offsets starting at 0"),
        (dict(cu_seqlens=torch.tensor([0, 3, 3, 9])), r"^cu_seqlens: expected strictly increasing offsets"),
        (dict(cu_seqlens=torch.tensor([0, 3, 5, 8])), r"^cu_seqlens: expected offsets ending at .*9.*got 8"),
        (dict(x=torch.zeros(2, 9, 4, dtype=F64)), r"^cu_seqlens: expected .*batch.*got batch size 2"),
        (dict(initial_state=torch.zeros(2, 2, 4, dtype=F64)), r"^initial_state: expected None or shape \(3, 2, 4\)"),
        (dict(cu_seqlens=None), r"^initial_state: expected None or shape \(1, 2, 4\) \(B, W−1, C\)"),
        (dict(x=torch.zeros(9, 4)), r"^x: expected a floating tensor of shape \(B, T, C\)"),
        (dict(weight=torch.zeros(5, 3)), r"^weight: expected shape \(C=4, W ≥ 1\), got \(5, 3\)"),
        (dict(bias=torch.zeros(3)), r"^bias: expected None or shape \(C=4,\), got \(3,\)"),
        (dict(backend="fast"), r"^backend: expected one of"),
        (dict(backend="causal_conv1d"), r"^backend: 'causal_conv1d' needs the causal_conv1d package"),
    ],
)
def test_bad_arguments_are_one_line_errors(over, message):
    with pytest.raises(ValueError, match=message) as err:
        _call(**over)
    assert "\n" not in str(err.value)


def test_bad_step_arguments():
    w = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"^x_t: expected a floating tensor of shape \(B, C\)"):
        causal_conv1d_step(torch.zeros(2, 1, 4), w)
    with pytest.raises(ValueError, match=r"^state: expected None or shape \(2, 2, 4\)"):
        causal_conv1d_step(torch.zeros(2, 4), w, None, torch.zeros(2, 3, 4))


def test_compiled_code_asks_whether_the_package_imports_without_tracing_the_import():
    """On a GPU without causal-conv1d, every fullgraph compile of a model with a conv stopped at the traced import
    of the package (an H100, 2026-11-28); the probe is a constant to torch.compile."""
    from hybrid.kernels.causal_conv.fused import causal_conv1d_importable

    expected = causal_conv1d_importable()
    compiled = torch.compile(lambda x: x + causal_conv1d_importable(), fullgraph=True, backend="eager")
    assert compiled(torch.zeros(1)).item() == float(expected)
