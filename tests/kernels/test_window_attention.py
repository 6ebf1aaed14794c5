"""window_attention: the block-local form and FlexAttention against the dense-mask float64 reference.

The reference itself is checked against a per-query loop that reads the definition literally. Tolerances are
relative to the reference: float64 forms agree to ~1e-15, float32 to its rounding.
"""
from __future__ import annotations

import importlib
import itertools

import pytest
import torch

from hybrid.kernels import window_attention, window_attention_reference
from hybrid.kernels.window_attention import resolve_window_backend, window_attention_blocked

flex = importlib.import_module("hybrid.kernels.window_attention.flex")
FLEX = pytest.mark.skipif(not flex.FLEX_AVAILABLE, reason="FlexAttention needs torch >= 2.5")
_seed = itertools.count(4321)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


def inputs(B, T, P, H, G, D, dtype=torch.float64, grad=False):
    """q (B, T, H, D); k, v (B, P + T, G, D): P tokens before the queries."""
    g = torch.Generator().manual_seed(next(_seed))
    q = torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, P + T, G, D, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, P + T, G, D, generator=g, dtype=torch.float64).to(dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def rel_err(actual, expected) -> float:
    """max |actual − expected| / max |expected|; the absolute error where expected is all zero (w = 1: ∂q = 0)."""
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    return err / scale if scale > 0 else err


# (T, P, w, H, G): odd T, T not a multiple of w, w ≥ T, w = 1, a prefix longer than the window, GQA, MQA
CASES = [
    (37, 0, 5, 4, 2),
    (37, 3, 5, 4, 4),
    (41, 13, 8, 6, 3),  # prefix > w: only the last w − 1 earlier tokens count
    (9, 0, 9, 2, 1),  # w = T
    (7, 4, 30, 3, 3),  # w > T + P: plain causal attention over everything
    (1, 6, 4, 2, 2),  # one query after a cache
    (23, 0, 1, 3, 1),  # w = 1: each token sees itself only
    (50, 20, 17, 2, 2),  # several blocks of b = w = 17
    (1, 6, None, 4, 2),  # global: a decode step, one query over a cache (no mask), GQA
    (5, 3, None, 2, 2),  # global: a chunk after a cache (a band mask)
]
IDS = [f"T{T}-P{P}-w{w}-H{H}G{G}" for T, P, w, H, G in CASES]


def loop_reference(q, k, v, w, scale):
    """One query at a time, the definition read literally."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    for i in range(T):
        p = S - T + i
        keys = range(0 if w is None else max(0, p - w + 1), p + 1)
        for h in range(H):
            kk, vv = k[:, list(keys), h // (H // G)], v[:, list(keys), h // (H // G)]  # (B, n, D)
            a = torch.softmax(torch.einsum("bd,bnd->bn", q[:, i, h], kk) * scale, dim=-1)
            out[:, i, h] = torch.einsum("bn,bnd->bd", a, vv)
    return out


def test_reference_is_the_definition():
    for T, P, w, H, G in CASES:
        q, k, v = inputs(2, T, P, H, G, 6)
        torch.testing.assert_close(window_attention_reference(q, k, v, w, 0.37), loop_reference(q, k, v, w, 0.37),
                                   atol=0, rtol=1e-12)


@pytest.mark.parametrize("block_size", [None, "w"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_blocked_matches_reference_with_gradients(case, block_size):
    T, P, w, H, G = case
    q, k, v = inputs(2, T, P, H, G, 6, grad=True)
    b = w if block_size == "w" else None  # "w": the smallest blocks (many of them, the padding paths)
    out = window_attention_blocked(q, k, v, w, 0.41, block_size=b)
    ref = window_attention_reference(q, k, v, w, 0.41)
    assert rel_err(out, ref) < 1e-13
    go = torch.randn_like(ref)
    grads = torch.autograd.grad(out, (q, k, v), go)
    ref_grads = torch.autograd.grad(ref, (q, k, v), go)
    for name, g, r in zip("qkv", grads, ref_grads):
        assert rel_err(g, r) < 1e-12, name


@FLEX
@pytest.mark.filterwarnings("ignore::UserWarning")  # eager FlexAttention warns that it is not compiled
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_flex_matches_reference(case):
    """Off CUDA FlexAttention runs eagerly (dense) and has no backward (torch 2.13 raises), so its forward
    alone is checked here: the same band, the same GQA mapping, the same prefix alignment. Its backward and
    the compiled CUDA kernel are only exercised on a GPU."""
    T, P, w, H, G = case
    q, k, v = inputs(1, T, P, H, G, 8)
    out = window_attention(q, k, v, w, scale=0.3, backend="flex")
    assert rel_err(out, window_attention_reference(q, k, v, w, 0.3)) < 1e-13


def test_float32_to_its_rounding():
    q, k, v = inputs(2, 301, 11, 4, 2, 16, dtype=torch.float32)
    out = window_attention(q, k, v, 24)
    ref = window_attention_reference(q.double(), k.double(), v.double(), 24, 16**-0.5)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) < 5e-6


def test_shared_key_and_value_tensor():
    """Shared-KV passes one tensor as key and value: its gradient is the sum of both roles."""
    q, k, _ = inputs(1, 29, 3, 4, 2, 6, grad=True)
    out = window_attention(q, k, k, 6, scale=0.5)
    ref = window_attention_reference(q, k, k, 6, 0.5)
    go = torch.randn_like(ref)
    (gk,), (rk,) = torch.autograd.grad(out, (k,), go), torch.autograd.grad(ref, (k,), go)
    assert rel_err(out, ref) < 1e-13 and rel_err(gk, rk) < 1e-12


def test_blocked_never_forms_a_T_by_S_tensor(largest_tensor):
    """Forward and backward at T = 2000, w = 24: every intermediate stays O(T·w), far below T·S."""
    T, P, w, H, G, D = 2000, 23, 24, 2, 1, 4
    q, k, v = inputs(1, T, P, H, G, D, dtype=torch.float32, grad=True)
    with largest_tensor() as probe:
        window_attention_blocked(q, k, v, w, 0.5).sum().backward()
    # the largest legitimate tensors: scores of all blocks, H·n·b·2b = H·T·2w (+ padding), and q, k, v
    assert probe.largest <= H * (T + w) * 2 * w
    assert probe.largest < T * (T + P) // 10


# ---------------------------------------------------------------------------------------------- choice
def test_auto_is_blocked_off_cuda(monkeypatch):
    monkeypatch.delenv("HYBRID_WINDOW_BACKEND", raising=False)
    q = torch.zeros(1, 3, 2, 4)
    assert resolve_window_backend(None, q) == resolve_window_backend("auto", q) == "blocked"
    monkeypatch.setenv("HYBRID_WINDOW_BACKEND", "reference")
    assert resolve_window_backend(None, q) == "reference"


def test_empty_queries():
    q, k, v = inputs(2, 0, 3, 2, 1, 4)
    assert window_attention(q, k, v, 3).shape == (2, 0, 2, 4)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda q, k, v: window_attention(q, k, v, 0), r"window: expected a positive int or None, got 0"),
        (lambda q, k, v: window_attention(q, k, v, True), r"window: expected a positive int or None, got True"),
        (lambda q, k, v: window_attention(q[0], k, v, 3), r"q: expected shape \(B, T, H, D\)"),
        (lambda q, k, v: window_attention(q, k[:, :2], v, 3), r"k: expected shape"),
        (lambda q, k, v: window_attention(q, k, v[..., :3], 3), r"v: expected shape"),
        (lambda q, k, v: window_attention(q, k.expand(2, 8, 4, 4), v, 3), r"k: expected shape"),  # 4 ∤ H = 6
        (lambda q, k, v: window_attention(q, k, v, 3, backend="fast"), r"backend: expected one of"),
        (lambda q, k, v: window_attention(q, k, v, 3, backend="flash"), r"backend: 'flash' needs flash-attn"),
    ],
)
def test_errors(call, message):
    q, k, v = inputs(2, 5, 3, 6, 1, 4)
    with pytest.raises(ValueError, match=message):
        call(q, k, v)


def test_auto_on_cuda_prefers_flash_then_flex_then_blocked(monkeypatch):
    """The choice logic, with CUDA-ness and availability faked (no kernel runs)."""
    interface = importlib.import_module("hybrid.kernels.window_attention.interface")
    monkeypatch.delenv("HYBRID_WINDOW_BACKEND", raising=False)

    class FakeCuda:
        is_cuda = True

        def __init__(self, D):
            self.shape = (1, 3, 2, D)

    monkeypatch.setattr(interface, "flash_supports", lambda q: True)
    monkeypatch.setattr(interface, "FLEX_AVAILABLE", True)
    assert interface.resolve_window_backend(None, FakeCuda(64)) == "flash"
    monkeypatch.setattr(interface, "flash_supports", lambda q: False)
    assert interface.resolve_window_backend(None, FakeCuda(64)) == "flex"
    assert interface.resolve_window_backend(None, FakeCuda(24)) == "blocked"
    monkeypatch.setattr(interface, "FLEX_AVAILABLE", False)
    assert interface.resolve_window_backend(None, FakeCuda(64)) == "blocked"
