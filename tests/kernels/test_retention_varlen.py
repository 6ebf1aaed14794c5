"""Packed sequences (``cu_seqlens``) for the retention op: packed equals separate.

Every packed call is compared, outputs, final states and the gradients w.r.t. q, k, v and the initial
states, with each sequence run alone through the float64 parallel form (``retention_reference`` without
cu_seqlens). Boundaries sit at, one before and one after every tile edge for tiles of 3, 4, 5 and 8
tokens, total lengths are not multiples of the tile, and sequences of length 1 and 2 are included.
Values are compared by the relative error max|err| / max|ref| per tensor. torch.compile and the custom
op's registration: tests/kernels/test_retention_compile.py.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from hybrid.kernels.retention import retention_chunkwise, retention_reference, retention_step

F64 = torch.float64
_seed = itertools.count(9001)


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def log_decays(H: int) -> torch.Tensor:
    """Fast decays (so tiny tiles still see far-apart entries matter) and one strong one."""
    lg = torch.log1p(-torch.exp2(-1.0 - torch.arange(H, dtype=F64)))
    lg[-1] = -2.5
    return lg


def packed(lens, H=3, Dk=4, Dv=6, init=True):
    """q, k, v ``(1, T, …)``, log_decay, cu_seqlens and initial states ``(N, …)`` (or None) for ``lens``."""
    T = sum(lens)
    q = torch.randn(1, T, H, Dk, generator=gen(), dtype=F64)
    k = torch.randn(1, T, H, Dk, generator=gen(), dtype=F64) * Dk**-0.5
    v = torch.randn(1, T, H, Dv, generator=gen(), dtype=F64)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.long)
    S = torch.randn(len(lens), H, Dk, Dv, generator=gen(), dtype=F64) if init else None
    return q, k, v, log_decays(H), cu, S


def edge_lens(C: int, tiles: int = 4, tail: int = 2) -> list[int]:
    """Boundaries at jC − 1, jC and jC + 1 for every tile edge j, total not a multiple of C."""
    cuts = sorted({p for j in range(1, tiles + 1) for p in (j * C - 1, j * C, j * C + 1)})
    T = tiles * C + tail
    ends = [p for p in cuts if 0 < p < T] + [T]
    return [b - a for a, b in zip([0] + ends, ends)]


def random_lens(rng: random.Random, n: int, longest: int) -> list[int]:
    return [1, 2] + [rng.randint(1, longest) for _ in range(n)]


def relative_error(got, want) -> float:
    scale = want.abs().max()
    return ((got - want).abs().max() / scale).item() if scale > 0 else got.abs().max().item()


def separate(q, k, v, lg, cu, S):
    """Each sequence alone through the float64 parallel form: o ``(1, T, H, Dv)``, finals ``(N, H, Dk, Dv)``."""
    outs, finals = [], []
    bounds = cu.tolist()
    for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
        o, f = retention_reference(q[:, a:b], k[:, a:b], v[:, a:b], lg, None if S is None else S[n:n + 1],
                                   output_final_state=True)
        outs.append(o)
        finals.append(f)
    return torch.cat(outs, 1), torch.cat(finals, 0)


def assert_packed_equals_separate(form, lens, init, tol=1e-12, **kw):
    q, k, v, lg, cu, S = packed(lens, init=init)
    leaves = [t.requires_grad_() for t in (q, k, v, S) if t is not None]
    o, final = form(q, k, v, lg, S, output_final_state=True, cu_seqlens=cu, **kw)
    o_ref, final_ref = separate(q, k, v, lg, cu, S)
    assert o.shape == o_ref.shape and final.shape == final_ref.shape == (len(lens), 3, 4, 6)
    assert relative_error(o, o_ref) < tol, "o"
    assert relative_error(final, final_ref) < tol, "final"
    go = torch.randn(o.shape, generator=gen(), dtype=F64)
    gf = torch.randn(final.shape, generator=gen(), dtype=F64)
    grads = torch.autograd.grad((o * go).sum() + (final * gf).sum(), leaves)
    grads_ref = torch.autograd.grad((o_ref * go).sum() + (final_ref * gf).sum(), leaves)
    for name, g, r in zip(("q", "k", "v", "initial_state"), grads, grads_ref):
        assert relative_error(g, r) < tol, name


@pytest.mark.parametrize("C", [3, 4, 5, 8])
@pytest.mark.parametrize("init", [False, True], ids=["zero0", "init"])
def test_chunkwise_packed_equals_separate_at_tile_edges(C, init):
    lens = edge_lens(C)
    assert 1 in lens and sum(lens) % C
    assert_packed_equals_separate(retention_chunkwise, lens, init, tile_size=C)


LENS = [
    [1],
    [2],
    [1, 1, 1, 1, 1],  # every token its own sequence
    [1, 2, 1, 2, 1, 2, 1],
    [13],  # one sequence through cu_seqlens
    [17, 1, 2, 9, 4, 31, 2],
    [5, 5, 5, 5],
    [2, 40, 1],  # one long sequence over many tiles
]


@pytest.mark.parametrize("C", [1, 3, 4, 5, 8, 64])
@pytest.mark.parametrize("lens", LENS, ids=lambda l: "-".join(map(str, l)))
def test_chunkwise_packed_equals_separate(lens, C):
    for init in (False, True):
        assert_packed_equals_separate(retention_chunkwise, lens, init, tile_size=C)


@pytest.mark.parametrize("seed", range(6))
def test_chunkwise_packed_equals_separate_random(seed):
    rng = random.Random(seed)
    lens = random_lens(rng, rng.randint(2, 9), 3 * 8 + 2)
    rng.shuffle(lens)
    assert_packed_equals_separate(retention_chunkwise, lens, rng.random() < 0.5,
                                  tile_size=rng.choice([3, 4, 5, 8, 16]))


@pytest.mark.parametrize("init", [False, True], ids=["zero0", "init"])
@pytest.mark.parametrize("lens", [LENS[3], LENS[5], edge_lens(4)], ids=["short", "mixed", "edges4"])
def test_reference_packed_equals_separate(lens, init):
    assert_packed_equals_separate(retention_reference, lens, init)


def test_float32_packed_close_to_float64():
    q, k, v, lg, cu, S = packed([100, 3, 1, 250, 46], Dk=8, Dv=8)
    o_ref, f_ref = separate(q, k, v, lg, cu, S)
    o, f = retention_chunkwise(*(t.float() for t in (q, k, v, lg)), S.float(), output_final_state=True,
                               cu_seqlens=cu)
    assert o.dtype == f.dtype == torch.float32
    assert relative_error(o.double(), o_ref) < 1e-5 and relative_error(f.double(), f_ref) < 1e-5


def test_int32_offsets_accepted():
    q, k, v, lg, cu, S = packed([3, 7, 2])
    o, f = retention_chunkwise(q, k, v, lg, S, output_final_state=True, cu_seqlens=cu, tile_size=4)
    o32, f32 = retention_chunkwise(q, k, v, lg, S, output_final_state=True, cu_seqlens=cu.int(), tile_size=4)
    assert torch.equal(o, o32) and torch.equal(f, f32)


def test_gradcheck_packed():
    q, k, v, lg, cu, S = packed([1, 4, 2, 5], H=2, Dk=2, Dv=3)
    leaves = tuple(t.requires_grad_() for t in (q, k, v, S))
    assert torch.autograd.gradcheck(
        lambda q, k, v, S: retention_chunkwise(q, k, v, lg, S, output_final_state=True, cu_seqlens=cu,
                                               tile_size=3), leaves)


def test_gradient_wrt_log_decay():
    q, k, v, lg, cu, S = packed([3, 9, 1, 6])
    lg = lg.clone().requires_grad_()
    o, f = retention_chunkwise(q, k, v, lg, S, output_final_state=True, cu_seqlens=cu, tile_size=4)
    o_ref, f_ref = separate(q, k, v, lg, cu, S)
    go, gf = torch.randn(o.shape, generator=gen(), dtype=F64), torch.randn(f.shape, generator=gen(), dtype=F64)
    (g,) = torch.autograd.grad((o * go).sum() + (f * gf).sum(), lg)
    (r,) = torch.autograd.grad((o_ref * go).sum() + (f_ref * gf).sum(), lg)
    assert relative_error(g, r) < 1e-12


# --- the other forms agree: one token at a time, and a sequence continued in pieces ------------------------


@pytest.mark.parametrize("init", [False, True], ids=["zero0", "init"])
def test_steps_reproduce_packed(init):
    lens = [1, 7, 2, 12, 4]
    q, k, v, lg, cu, S0 = packed(lens, init=init)
    o, final = retention_chunkwise(q, k, v, lg, S0, output_final_state=True, cu_seqlens=cu, tile_size=4)
    bounds = cu.tolist()
    for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
        S = None if S0 is None else S0[n:n + 1]
        for t in range(a, b):
            o_t, S = retention_step(q[:, t], k[:, t], v[:, t], lg, S)
            assert relative_error(o_t, o[:, t]) < 1e-12, (n, t)
        assert relative_error(S[0], final[n]) < 1e-12, n


@pytest.mark.parametrize("C", [1, 3, 4, 8, 64])
def test_chunked_prefill_equals_one_call(C):
    """Split one sequence at every point of a range into two calls, carrying the final state."""
    q, k, v, lg, cu, S0 = packed([2, 29])
    q, k, v, S0 = q[:, 2:].expand(2, -1, -1, -1), k[:, 2:].expand(2, -1, -1, -1), v[:, 2:].expand(2, -1, -1, -1), S0
    S0 = torch.stack([S0[0], S0[1]])  # two rows, two different initial states
    o_ref, f_ref = retention_chunkwise(q, k, v, lg, S0, output_final_state=True, tile_size=C)
    for cut in range(0, 12):
        o1, S = retention_chunkwise(q[:, :cut], k[:, :cut], v[:, :cut], lg, S0, output_final_state=True,
                                    tile_size=C)
        o2, f = retention_chunkwise(q[:, cut:], k[:, cut:], v[:, cut:], lg, S, output_final_state=True,
                                    tile_size=C)
        assert relative_error(torch.cat([o1, o2], 1), o_ref) < 1e-12, cut
        assert relative_error(f, f_ref) < 1e-12, cut


def test_packed_continues_in_pieces():
    """A packed prefill continued by a second packed call from the first's final states."""
    lens1, lens2 = [5, 1, 9], [4, 11, 2]
    q, k, v, lg, _, S0 = packed([a + b for a, b in zip(lens1, lens2)])
    cu = torch.tensor([0, *itertools.accumulate(a + b for a, b in zip(lens1, lens2))])
    o_ref, f_ref = separate(q, k, v, lg, cu, S0)
    first = torch.cat([torch.arange(a, a + l) for a, l in zip(cu.tolist(), lens1)])
    second = torch.cat([torch.arange(a + l1, a + l1 + l2) for a, l1, l2 in zip(cu.tolist(), lens1, lens2)])
    cu1 = torch.tensor([0, *itertools.accumulate(lens1)])
    cu2 = torch.tensor([0, *itertools.accumulate(lens2)])
    o1, S = retention_chunkwise(q[:, first], k[:, first], v[:, first], lg, S0, output_final_state=True,
                                cu_seqlens=cu1, tile_size=4)
    o2, f = retention_chunkwise(q[:, second], k[:, second], v[:, second], lg, S, output_final_state=True,
                                cu_seqlens=cu2, tile_size=4)
    assert relative_error(o1, o_ref[:, first]) < 1e-12 and relative_error(o2, o_ref[:, second]) < 1e-12
    assert relative_error(f, f_ref) < 1e-12


# --- padding is a document of its own -------------------------------------------------------------------


@pytest.mark.parametrize("C", [3, 4, 8])
def test_padding_document_changes_nothing(C):
    """Garbage padding packed as documents of its own leaves every real document's outputs, final states
    and gradients as they were, and the padding receives exactly zero gradient."""
    real = [5, 1, 7]
    q, k, v, lg, cu, S = packed(real)
    pad_len = [3, 1, 6]  # a pad after every document
    lens, pieces, is_real = [], [], []
    bounds = cu.tolist()
    for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
        lens += [b - a, pad_len[n]]
        pieces += [torch.arange(a, b), torch.full((pad_len[n],), -1)]
        is_real += [True, False]
    idx = torch.cat(pieces)
    T = idx.numel()
    garbage = lambda t: torch.randn((1, T) + t.shape[2:], generator=gen(), dtype=F64) * 1e3
    qp, kp, vp = (torch.where((idx >= 0)[None, :, None, None], t[:, idx.clamp(min=0)], garbage(t)) for t in (q, k, v))
    Sp = torch.randn(len(lens), *S.shape[1:], generator=gen(), dtype=F64) * 1e3
    Sp[torch.tensor(is_real)] = S
    cup = torch.tensor([0, *itertools.accumulate(lens)])
    leaves = [t.requires_grad_() for t in (q, k, v, S)]
    leaves_p = [t.requires_grad_() for t in (qp, kp, vp, Sp)]
    o, f = retention_chunkwise(q, k, v, lg, S, output_final_state=True, cu_seqlens=cu, tile_size=C)
    op, fp = retention_chunkwise(qp, kp, vp, lg, Sp, output_final_state=True, cu_seqlens=cup, tile_size=C)
    keep = (idx >= 0).nonzero()[:, 0]
    assert relative_error(op[:, keep], o) < 1e-12 and relative_error(fp[torch.tensor(is_real)], f) < 1e-12
    go = torch.randn(o.shape, generator=gen(), dtype=F64)
    gf = torch.randn(f.shape, generator=gen(), dtype=F64)
    grads = torch.autograd.grad((o * go).sum() + (f * gf).sum(), leaves)
    grads_p = torch.autograd.grad((op[:, keep] * go).sum() + (fp[torch.tensor(is_real)] * gf).sum(), leaves_p)
    for name, g, gp in zip("qkv", grads[:3], grads_p[:3]):
        assert relative_error(gp[:, keep], g) < 1e-12, name
        assert not gp[:, (idx < 0).nonzero()[:, 0]].any(), name  # exactly zero on the padding
    assert relative_error(grads_p[3][torch.tensor(is_real)], grads[3]) < 1e-12
    assert not grads_p[3][~torch.tensor(is_real)].any()


# --- errors: one line, naming the argument ------------------------------------------------------------


def _bad_cu_cases():
    q, k, v, lg, cu, S = packed([3, 4, 5])  # total_T = 12
    return {
        "2-D": (q, torch.tensor([[0, 3, 7, 12]])),
        "float": (q, torch.tensor([0.0, 3.0, 7.0, 12.0])),
        "device": (q, torch.tensor([0, 3, 7, 12], device="meta")),
        "first": (q, torch.tensor([1, 3, 7, 12])),
        "repeat": (q, torch.tensor([0, 3, 3, 12])),
        "decreasing": (q, torch.tensor([0, 7, 3, 12])),
        "last-short": (q, torch.tensor([0, 3, 7, 11])),
        "last-long": (q, torch.tensor([0, 3, 7, 13])),
        "batch": (q.expand(2, -1, -1, -1), torch.tensor([0, 3, 7, 12])),
        "one-offset": (q, torch.tensor([0])),
        "list": (q, [0, 3, 7, 12]),
    }


@pytest.mark.parametrize("form", [retention_chunkwise, retention_reference])
@pytest.mark.parametrize("case", list(_bad_cu_cases()))
def test_bad_cu_seqlens(form, case):
    q, cu = _bad_cu_cases()[case]
    k, v = q.clone(), torch.randn(q.shape[:3] + (6,), dtype=F64)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected .*, got ") as err:
        form(q, k, v, log_decays(q.shape[2]), cu_seqlens=cu)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("form", [retention_chunkwise, retention_reference])
@pytest.mark.parametrize("shape", [(2, 3, 4, 6), (3, 3, 4, 5), (3, 4, 6), (1, 3, 4, 6)])
def test_bad_initial_state_with_cu_seqlens(form, shape):
    q, k, v, lg, cu, _ = packed([3, 4, 5])
    want = r"^initial_state: expected shape \(N, H, Dk, Dv\) = \(3, 3, 4, 6\), got"
    with pytest.raises(ValueError, match=want) as err:
        form(q, k, v, lg, torch.zeros(shape, dtype=F64), cu_seqlens=cu)
    assert "\n" not in str(err.value)
