"""The retention op under torch.compile: ``hybrid::retention_chunkwise`` is a torch.library custom op (fake
and autograd registered), so ``fullgraph=True`` traces packed and plain calls with no graph break, and the
compiled forward and backward equal eager. ``torch.library.opcheck`` checks the registrations.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import hybrid.kernels.retention.chunkwise  # noqa: F401  (registers torch.ops.hybrid.retention_chunkwise)
from hybrid.kernels.retention import retention_chunkwise

F64 = torch.float64
_seed = itertools.count(4242)


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def inputs(B, lens, H=2, Dk=4, Dv=6, init=True, dtype=F64):
    """q, k, v ``(B, T, …)`` with T = sum(lens), log_decay, cu_seqlens (None when lens is an int: plain rows)."""
    T = lens if isinstance(lens, int) else sum(lens)
    q = torch.randn(B, T, H, Dk, generator=gen(), dtype=dtype)
    k = torch.randn(B, T, H, Dk, generator=gen(), dtype=dtype) * Dk**-0.5
    v = torch.randn(B, T, H, Dv, generator=gen(), dtype=dtype)
    lg = torch.log1p(-torch.exp2(-1.0 - torch.arange(H, dtype=dtype)))
    cu = None if isinstance(lens, int) else torch.tensor([0, *itertools.accumulate(lens)])
    n = B if cu is None else len(lens)
    S = torch.randn(n, H, Dk, Dv, generator=gen(), dtype=dtype) if init else None
    return q, k, v, lg, S, cu


def relative_error(got, want) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def run(fn, q, k, v, lg, S, cu, tile, final):
    """Forward and the gradients of a loss on o (and the final states) w.r.t. q, k, v (and S)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v) + ((S,) if S is not None else ())]
    o, f = fn(*leaves[:3], lg, leaves[3] if S is not None else None, cu, tile, final)
    assert (f is None) == (not final)
    loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum()
    if final:
        loss = loss + (f * torch.linspace(1, 2, f.numel(), dtype=f.dtype).view(f.shape)).sum()
    return [o] + ([f] if final else []) + list(torch.autograd.grad(loss, leaves))


def call(q, k, v, lg, S, cu, tile, final):
    return retention_chunkwise(q, k, v, lg, S, output_final_state=final, cu_seqlens=cu, tile_size=tile)


CASES = [  # (B, lens or T, init, tile_size, output_final_state)
    (1, [5, 1, 8, 2, 7], True, 4, True),
    (1, [5, 1, 8, 2, 7], False, 3, False),
    (2, 19, True, 8, True),  # plain rows, a short last tile
    (3, 16, False, 4, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-{c[1]}-init{int(c[2])}-C{c[3]}-final{int(c[4])}")
def test_fullgraph_aot_eager_equals_eager(case):
    B, lens, init, tile, final = case
    args = inputs(B, lens, init=init)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    got = run(compiled, *args, tile, final)
    want = run(call, *args, tile, final)
    for g, w in zip(got, want):
        assert g.shape == w.shape and relative_error(g, w) < 1e-12


def test_fullgraph_inductor_equals_eager():
    args = inputs(1, [6, 1, 2, 9, 5], dtype=torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True)  # inductor
    # no on-disk caches: the AOTAutograd cache keys on the forward graph, not on the op's Python backward,
    # so an entry written before a change to that backward would replay the old one
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        got = run(compiled, *args, 4, True)
    want = run(call, *args, 4, True)
    for g, w in zip(got, want):
        assert relative_error(g, w) < 1e-5


def test_dynamic_shapes_new_packing_no_graph_break():
    """One compiled function serves packings with a different number and length of sequences."""
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager", dynamic=True)
    for lens in ([3, 9, 2], [1, 1, 4, 7, 6], [20]):
        args = inputs(1, lens)
        for g, w in zip(run(compiled, *args, 4, True), run(call, *args, 4, True)):
            assert relative_error(g, w) < 1e-12


def test_op_called_directly_equals_the_function():
    """The op's own autograd (the forward recomputed and differentiated) equals eager autograd."""
    q, k, v, lg, S, cu = inputs(1, [4, 1, 11, 3])
    lg = lg.clone().requires_grad_()

    def op(q, k, v, lg_, S, cu, tile, final):
        o, f = torch.ops.hybrid.retention_chunkwise(q, k, v, lg, S, cu, tile, final)
        return o, (f if final else None)

    def fn(q, k, v, lg_, S, cu, tile, final):
        return call(q, k, v, lg, S, cu, tile, final)

    for final in (True, False):
        for g, w in zip(run(op, q, k, v, lg, S, cu, 4, final), run(fn, q, k, v, lg, S, cu, 4, final)):
            assert relative_error(g, w) < 1e-12
    o, f = torch.ops.hybrid.retention_chunkwise(q, k, v, lg, S, cu, 4, True)
    (dlg,) = torch.autograd.grad(o.sum() + f.sum(), lg)
    o2, f2 = call(q, k, v, lg, S, cu, 4, True)
    (dlg2,) = torch.autograd.grad(o2.sum() + f2.sum(), lg)
    assert relative_error(dlg, dlg2) < 1e-12


OPCHECK = [  # (B, lens or T, init, tile_size, output_final_state)
    (1, [3, 1, 5], True, 4, True),
    (1, [3, 1, 5], False, 2, False),
    (2, 7, True, 3, True),
    (2, 7, False, 64, False),
    (2, 0, True, 4, True),  # empty: the state passes through as a copy
]


@pytest.mark.parametrize("case", OPCHECK, ids=lambda c: f"B{c[0]}-{c[1]}-init{int(c[2])}-C{c[3]}-final{int(c[4])}")
def test_opcheck(case):
    B, lens, init, tile, final = case
    q, k, v, lg, S, cu = inputs(B, lens, init=init)
    for t in (q, k, v) + ((S,) if S is not None else ()):
        t.requires_grad_()
    torch.library.opcheck(torch.ops.hybrid.retention_chunkwise.default, (q, k, v, lg, S, cu, tile, final))
    o = torch.randn(q.shape[:3] + v.shape[-1:], generator=gen(), dtype=F64)
    gf = torch.randn(S.shape if S is not None else (B if cu is None else cu.numel() - 1, 2, 4, 6),
                     generator=gen(), dtype=F64) if final else None
    for needs in ([True] * 5, [False, True, True, False, True]):
        torch.library.opcheck(torch.ops.hybrid.retention_chunkwise_backward.default,
                              (o, gf, q.detach(), k.detach(), v.detach(), lg, None if S is None else S.detach(), cu,
                               tile, needs))
