"""window_attention with packed sequences (`cu_seqlens`, `cu_seqlens_k`) and global causal attention.

"Packed equals separate": a packed call and its gradients equal each sequence run alone through the dense
reference in float64, for every backend that runs on CPU (reference, blocked; FlexAttention's forward), windowed
and global, with GQA, with per-sequence prefixes of different lengths (0 included), lengths 1 and 2, and
sequence boundaries at, one before and one after every block edge and window edge. flash-attn's varlen call
is checked through a stand-in package that reads flash-attn's documented semantics literally.
"""
from __future__ import annotations

import importlib
import itertools
import random
import sys
import types

import pytest
import torch

from hybrid.kernels import window_attention, window_attention_reference
from hybrid.kernels.window_attention import window_attention_blocked

flex = importlib.import_module("hybrid.kernels.window_attention.flex")
flash = importlib.import_module("hybrid.kernels.window_attention.flash")
FLEX = pytest.mark.skipif(not flex.FLEX_AVAILABLE, reason="FlexAttention needs torch >= 2.5")
MIN_BLOCK = importlib.import_module("hybrid.kernels.window_attention.blocked").MIN_BLOCK
_seed = itertools.count(8765)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)])


def packed(len_q, prefixes, H, G, D, grad=True):
    """q (1, Σ len_q, H, D); k, v (1, Σ (prefix + len_q), G, D); cu_seqlens, cu_seqlens_k (None without prefixes)."""
    g = torch.Generator().manual_seed(next(_seed))
    len_k = [lq + p for lq, p in zip(len_q, prefixes or [0] * len(len_q))]
    q = torch.randn(1, sum(len_q), H, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, sum(len_k), G, D, generator=g, dtype=torch.float64)
    v = torch.randn(1, sum(len_k), G, D, generator=g, dtype=torch.float64)
    return [t.requires_grad_(grad) for t in (q, k, v)], offsets(len_q), None if prefixes is None else offsets(len_k)


def separate(q, k, v, window, scale, cu_q, cu_k):
    """Each sequence alone through the dense reference (its prefix first), concatenated."""
    cu_k = cu_q if cu_k is None else cu_k
    outs = [window_attention_reference(q[:, cu_q[n]:cu_q[n + 1]], k[:, cu_k[n]:cu_k[n + 1]],
                                       v[:, cu_k[n]:cu_k[n + 1]], window, scale) for n in range(len(cu_q) - 1)]
    return torch.cat(outs, dim=1)


def rel_err(actual, expected) -> float:
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    return err / scale if scale > 0 else err


def assert_packed_equals_separate(call, q, k, v, window, cu_q, cu_k, grad=True):
    out = call(q, k, v, window, 0.37, cu_q, cu_k)
    ref = separate(q, k, v, window, 0.37, cu_q, cu_k)
    assert out.shape == q.shape and rel_err(out, ref) < 1e-13
    if grad:
        go = torch.randn_like(ref)
        for name, g, r in zip("qkv", torch.autograd.grad(out, (q, k, v), go), torch.autograd.grad(ref, (q, k, v), go)):
            assert rel_err(g, r) < 1e-12, name


def edge_lengths(b: int, n_edges: int = 3) -> list[int]:
    """Lengths whose boundaries fall one before, at and one after each of the first block edges k·b."""
    cuts = sorted({c for e in range(1, n_edges + 1) for c in (e * b - 1, e * b, e * b + 1) if c > 0})
    ends = cuts + [n_edges * b + 3]
    return [bb - a for a, bb in zip([0] + ends, ends)]


def random_lengths(rng: random.Random, n: int, longest: int) -> list[int]:
    lengths = [rng.randint(1, longest) for _ in range(n)] + [1, 2]  # documents of length 1 and 2 always
    rng.shuffle(lengths)
    return lengths


def prefixes_for(kind: str, n: int, w: int, rng: random.Random):
    """None (no cu_seqlens_k), all zeros (cu_seqlens_k = cu_seqlens), or mixed lengths around the window."""
    if kind == "none":
        return None
    if kind == "zero":
        return [0] * n
    return [rng.choice([0, 1, w - 1, w, w + 3, 11]) for _ in range(n)]


def via(backend, block_size=None):
    if block_size is not None:
        return lambda q, k, v, w, s, cq, ck: window_attention_blocked(q, k, v, w, s, block_size=block_size,
                                                                      cu_seqlens=cq, cu_seqlens_k=ck)
    return lambda q, k, v, w, s, cq, ck: window_attention(q, k, v, w, scale=s, backend=backend, cu_seqlens=cq,
                                                          cu_seqlens_k=ck)


WINDOWS = [1, 3, 5, None]
PREFIXES = ["none", "zero", "mixed"]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w}")
@pytest.mark.parametrize("backend", ["reference", "blocked"])
def test_packed_equals_separate_random_lengths(backend, window, prefix):
    rng = random.Random(f"{backend}{window}{prefix}")
    for H, G in ((4, 2), (3, 1)):  # GQA, MQA
        len_q = random_lengths(rng, 6, 23)
        (q, k, v), cu_q, cu_k = packed(len_q, prefixes_for(prefix, len(len_q), window or 4, rng), H, G, 5)
        assert_packed_equals_separate(via(backend), q, k, v, window, cu_q, cu_k)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("window,block_size", [(3, None), (5, None), (3, 3), (5, 5), (5, 7), (None, None)],
                         ids=lambda x: str(x))
def test_blocked_boundaries_at_block_edges(window, block_size, prefix):
    """Sequence boundaries one before, at and one after every block edge of the default block (max(w, 16))
    and of small explicit blocks; global attention's block is its longest sequence."""
    rng = random.Random(f"{window}{block_size}{prefix}")
    b = block_size or max(window or 1, MIN_BLOCK)
    len_q = edge_lengths(b)
    (q, k, v), cu_q, cu_k = packed(len_q, prefixes_for(prefix, len(len_q), window or 4, rng), 4, 2, 3)
    assert_packed_equals_separate(via("blocked", block_size), q, k, v, window, cu_q, cu_k)


@pytest.mark.parametrize("window", [3, 5])
def test_blocked_window_edges(window):
    """Sequences of w − 1, w, w + 1, 2w tokens (and 1, 2) with prefixes of w − 2, w − 1, w, w + 1 keys."""
    w = window
    len_q = [w - 1, w, w + 1, 2 * w, 1, 2, w + 1, w]
    prefixes = [w - 1, w, w - 2, 0, w + 1, w - 1, 1, w]
    for block_size in (None, w):
        (q, k, v), cu_q, cu_k = packed(len_q, prefixes, 4, 2, 3)
        assert_packed_equals_separate(via("blocked", block_size), q, k, v, w, cu_q, cu_k)


def test_blocked_every_split_point():
    """Two sequences, the boundary at every position of 9 tokens, blocks of 3 = w, prefixes of several sizes."""
    for split, prefixes, window in itertools.product(range(1, 9), ([0, 0], [2, 1], [0, 4], [5, 0]), (3, None)):
        (q, k, v), cu_q, cu_k = packed([split, 9 - split], prefixes, 2, 1, 3)
        assert_packed_equals_separate(via("blocked", 3), q, k, v, window, cu_q, cu_k)


def test_one_sequence_is_the_unpacked_call():
    (q, k, v), cu_q, cu_k = packed([13], [4], 4, 2, 6)
    for w in (3, None):
        out = window_attention(q, k, v, w, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
        assert torch.equal(out, window_attention(q, k, v, w))


def test_global_unpacked_with_prefix_and_batch():
    """window=None without packing: every form against the reference, a prefix included, B = 2."""
    g = torch.Generator().manual_seed(3)
    for T, P in ((11, 0), (11, 6), (1, 5)):
        q = torch.randn(2, T, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, P + T, 2, 6, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(2, P + T, 2, 6, generator=g, dtype=torch.float64, requires_grad=True)
        ref = window_attention_reference(q, k, v, None, 0.4)
        out = window_attention(q, k, v, None, scale=0.4)
        assert rel_err(out, ref) < 1e-13
        go = torch.randn_like(ref)
        for g1, g2 in zip(torch.autograd.grad(out, (q, k, v), go), torch.autograd.grad(ref, (q, k, v), go)):
            assert rel_err(g1, g2) < 1e-12


def test_padding_sequence_changes_nothing_else():
    """A padding tail packed as its own sequence leaves the other sequences' outputs and gradients unchanged."""
    (q, k, v), cu_q, cu_k = packed([7, 2, 12], [3, 0, 5], 4, 2, 4)
    (qp, kp, vp), _, _ = packed([5], [0], 4, 2, 4)
    cu_q2, cu_k2 = torch.cat([cu_q, cu_q[-1:] + 5]), torch.cat([cu_k, cu_k[-1:] + 5])
    qq, kk, vv = (torch.cat([a, b], 1).detach().requires_grad_() for a, b in ((q, qp), (k, kp), (v, vp)))
    for w in (3, None):
        out = window_attention(q, k, v, w, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
        out2 = window_attention(qq, kk, vv, w, cu_seqlens=cu_q2, cu_seqlens_k=cu_k2)
        assert rel_err(out2[:, : q.shape[1]], out) < 1e-14
        go = torch.randn_like(out2)
        g1 = torch.autograd.grad(out, (q, k, v), go[:, : q.shape[1]])
        real = (torch.arange(out2.shape[1]) < q.shape[1])[None, :, None, None]  # padding's outputs get no gradient
        g2 = torch.autograd.grad(out2, (qq, kk, vv), go * real)
        for a, b in zip(g1, g2):
            assert rel_err(b[:, : a.shape[1]], a) < 1e-14 and b[:, a.shape[1]:].abs().max() == 0


@FLEX
@pytest.mark.filterwarnings("ignore::UserWarning")  # eager FlexAttention warns that it is not compiled
@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w}")
def test_flex_document_mask_forward(window, prefix):
    """Eager FlexAttention on CPU has no backward (torch 2.13): the document mask's forward only."""
    rng = random.Random(f"flex{window}{prefix}")
    len_q = random_lengths(rng, 5, 19)
    (q, k, v), cu_q, cu_k = packed(len_q, prefixes_for(prefix, len(len_q), window or 4, rng), 4, 2, 8, grad=False)
    assert_packed_equals_separate(via("flex"), q, k, v, window, cu_q, cu_k, grad=False)


@FLEX
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("P", [0, 4])
def test_flex_global_unpacked_forward(P):
    g = torch.Generator().manual_seed(P)
    q = torch.randn(2, 9, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, P + 9, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    out = window_attention(q, k, v, None, scale=0.3, backend="flex")
    assert rel_err(out, window_attention_reference(q, k, v, None, 0.3)) < 1e-13


# ------------------------------------------------------------------------------------ flash-attn wiring
def _fake_flash_attn(calls):
    """flash-attn's documented semantics, read literally: per sequence, query i (of Lq) sees key j (of Lk) iff
    j ≤ i + Lk − Lq + right and, with left ≥ 0, j ≥ i + Lk − Lq − left (causal sets right = 0)."""

    def attend(q, k, v, scale, left, right):  # (Lq, H, D), (Lk, G, D)
        Lq, H = q.shape[:2]
        Lk, G = k.shape[:2]
        k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
        i, j = torch.arange(Lq)[:, None] + Lk - Lq, torch.arange(Lk)[None, :]
        ok = (j <= i + right) & ((j >= i - left) if left >= 0 else True)
        s = torch.einsum("ihd,jhd->hij", q, k) * scale
        return torch.einsum("hij,jhd->ihd", torch.softmax(s.masked_fill(~ok, float("-inf")), -1), v)

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), **_):
        calls.append(("varlen", max_seqlen_q, max_seqlen_k, window_size))
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32 and causal
        assert max_seqlen_q == int(cu_seqlens_q.diff().max()) and max_seqlen_k == int(cu_seqlens_k.diff().max())
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        return torch.cat([attend(q[cq[n]:cq[n + 1]], k[ck[n]:ck[n + 1]], v[ck[n]:ck[n + 1]], softmax_scale,
                                 window_size[0], 0) for n in range(len(cq) - 1)])

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **_):
        calls.append(("dense", window_size))
        assert causal
        return torch.stack([attend(q[b], k[b], v[b], softmax_scale, window_size[0], 0) for b in range(q.shape[0])])

    return types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)


@pytest.mark.parametrize("window", [3, None])
def test_flash_wiring_with_a_stand_in(monkeypatch, window):
    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn(calls))
    (q, k, v), cu_q, cu_k = packed([4, 1, 9, 2], [0, 3, 5, 1], 4, 2, 6, grad=False)
    out = flash.window_attention_flash(q, k, v, window, 0.37, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
    assert rel_err(out, separate(q, k, v, window, 0.37, cu_q, cu_k)) < 1e-13
    (q, k, v), _, _ = packed([7], [0], 4, 2, 6, grad=False)
    q = q.expand(2, -1, -1, -1)  # (2, 7, H, D)
    k, v = (torch.cat([t[:, :2], t], 1).expand(2, -1, -1, -1) for t in (k, v))  # (2, 9, G, D): a prefix of 2
    out = flash.window_attention_flash(q, k, v, window, 0.37)
    assert rel_err(out, window_attention_reference(q, k, v, window, 0.37)) < 1e-13
    left = -1 if window is None else window - 1
    assert calls == [("varlen", 9, 14, (left, 0)), ("dense", (left, 0))]


# --------------------------------------------------------------------------------------------- memory
def test_packed_blocked_memory_is_local(largest_tensor):
    """2000 packed tokens, 40 documents: windowed O(total·w), global O(total·longest), never total × total."""
    rng = random.Random(0)
    len_q = random_lengths(rng, 38, 90)
    (q, k, v), cu_q, cu_k = packed(len_q, [rng.randint(0, 30) for _ in len_q], 2, 1, 4)
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    total, total_k, w, H = q.shape[1], k.shape[1], 24, 2
    with largest_tensor() as probe:
        window_attention_blocked(q, k, v, w, 0.5, cu_seqlens=cu_q, cu_seqlens_k=cu_k).sum().backward()
    assert probe.largest <= H * (total + len(len_q) * w + w) * 2 * w
    longest = int(cu_k.diff().max())
    with largest_tensor() as probe:
        window_attention_blocked(q, k, v, None, 0.5, cu_seqlens=cu_q, cu_seqlens_k=cu_k).sum().backward()
    assert probe.largest <= H * (total_k + longest) * 2 * longest
    assert probe.largest < total * total_k // 4


# --------------------------------------------------------------------------------------------- errors
def _bad(**over):
    (q, k, v), cu_q, cu_k = packed([3, 2, 4], [1, 0, 2], 4, 2, 4, grad=False)
    args = dict(q=q, k=k, v=v, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over,message",  # the offsets' own checks are the shared ones of hybrid.kernels.varlen: matched loosely
    [
        (dict(cu_seqlens=torch.tensor([[0, 3, 5, 9]])), r"^cu_seqlens: expected a 1-D .*got shape \(1, 4\)"),
        (dict(cu_seqlens=[0, 3, 5, 9]), r"^cu_seqlens: expected .*got list"),
        (dict(cu_seqlens=torch.tensor([0.0, 3, 5, 9])), r"^cu_seqlens: expected an int.*got torch.float32"),
        (dict(cu_seqlens=torch.tensor([0, 3, 5, 9], device="meta")), r"^cu_seqlens: expected a tensor on cpu"),
        (dict(cu_seqlens=torch.tensor([1, 3, 5, 9])), r"^cu_seqlens: expected offsets starting at 0, got 1"),
        (dict(cu_seqlens=torch.tensor([0, 3, 3, 9])), r"^cu_seqlens: expected strictly increasing offsets"),
        (dict(cu_seqlens=torch.tensor([0, 5, 3, 9])), r"^cu_seqlens: expected strictly increasing offsets"),
        (dict(cu_seqlens=torch.tensor([0, 3, 5, 8])), r"^cu_seqlens: expected offsets ending at .*9.*got 8"),
        (dict(cu_seqlens_k=torch.tensor([0, 4, 6, 11])), r"^cu_seqlens_k: expected offsets ending at .*12.*got 11"),
        (dict(cu_seqlens_k=torch.tensor([2, 4, 6, 12])), r"^cu_seqlens_k: expected offsets starting at 0"),
        (dict(cu_seqlens_k=torch.tensor([0, 4, 12])), r"^cu_seqlens_k: expected 4 entries \(N \+ 1, .*got 3"),
        (dict(cu_seqlens_k=torch.tensor([0, 4, 5, 12])),
         r"^cu_seqlens_k: expected each sequence .* got sequence 1 with 1 keys for 2 queries"),
        (dict(cu_seqlens=None), r"^cu_seqlens_k: expected None when cu_seqlens is None"),
        (dict(cu_seqlens_k=None), r"^k: expected total_k = total_q = 9 tokens without cu_seqlens_k"),
        (dict(cu_seqlens_k=torch.tensor([0, 4, 6, 12], device="meta")), r"^cu_seqlens_k: expected a tensor on cpu"),
        (dict(cu_seqlens_k=torch.tensor([0.0, 4, 6, 12])), r"^cu_seqlens_k: expected an int"),
    ],
)
def test_bad_offsets_are_one_line_errors(over, message):
    args = _bad(**over)
    with pytest.raises(ValueError, match=message) as err:
        window_attention(args.pop("q"), args.pop("k"), args.pop("v"), 3, **args)
    assert "\n" not in str(err.value)


def test_batch_other_than_one_is_refused():
    (q, k, v), cu_q, _ = packed([3, 2], None, 2, 1, 4, grad=False)
    q, k, v = (t.expand(2, -1, -1, -1) for t in (q, k, v))
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected .*batch.*got batch size 2"):
        window_attention(q, k, v, 3, cu_seqlens=cu_q)


def test_int32_offsets_accepted():
    (q, k, v), cu_q, cu_k = packed([3, 1, 6], [2, 0, 1], 2, 2, 4, grad=False)
    out = window_attention(q, k, v, 2, cu_seqlens=cu_q.int(), cu_seqlens_k=cu_k.int())
    assert rel_err(out, separate(q, k, v, 2, 4 ** -0.5, cu_q, cu_k)) < 1e-13
