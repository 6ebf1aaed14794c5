"""The retention op: chunkwise form and one-token step against the float64 parallel form (the reference).

Float64 inputs, fresh random values, odd lengths that leave a short last tile, tiles from 1 token to longer
than the sequence, with and without an incoming state, outputs, final state and every gradient. Packed
sequences (cu_seqlens) and torch.compile: tests/kernels/test_retention_varlen.py. Values
are compared by the relative error max|err| / max|ref| per tensor.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from hybrid.kernels.retention import retention_chunkwise, retention_reference, retention_step

F64 = torch.float64
_seed = itertools.count(777)


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def make(B, T, H, Dk, Dv, state, log_decay=None):
    q = torch.randn(B, T, H, Dk, generator=gen(), dtype=F64)
    k = torch.randn(B, T, H, Dk, generator=gen(), dtype=F64) * Dk**-0.5
    v = torch.randn(B, T, H, Dv, generator=gen(), dtype=F64)
    if log_decay is None:  # RetNet's per-head decays and a strong one
        log_decay = torch.log1p(-torch.exp2(-5.0 - torch.arange(H, dtype=F64)))
        log_decay[-1] = -3.0
    S = torch.randn(B, H, Dk, Dv, generator=gen(), dtype=F64) if state else None
    return q, k, v, log_decay, S


def relative_error(got, want) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


CASES = [  # (B, T, H, Dk, Dv, tile_size)
    (2, 1, 3, 4, 6, 64),
    (2, 17, 3, 6, 4, 64),  # one tile
    (1, 64, 2, 4, 4, 64),  # exactly one tile
    (2, 65, 2, 4, 6, 64),  # a tile and a tile of 1
    (2, 131, 3, 6, 4, 16),  # 8 tiles and a tile of 3
    (1, 37, 2, 4, 4, 1),  # tiles of one token: the recurrent form
    (3, 29, 1, 2, 8, 7),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}T{}H{}Dk{}Dv{}C{}".format(*c))
@pytest.mark.parametrize("state", [False, True], ids=["zero0", "state"])
def test_chunkwise_matches_parallel_form(case, state):
    *shape, tile = case
    inputs = make(*shape, state)
    leaves = [t.requires_grad_() for t in inputs if t is not None and t.dim() > 1]
    o, S = retention_chunkwise(*inputs, output_final_state=True, tile_size=tile)
    o_ref, S_ref = retention_reference(*inputs, output_final_state=True)
    assert o.shape == o_ref.shape and S.shape == S_ref.shape
    assert relative_error(o, o_ref) < 1e-12 and relative_error(S, S_ref) < 1e-12
    go, gS = torch.randn(o.shape, generator=gen(), dtype=F64), torch.randn(S.shape, generator=gen(), dtype=F64)
    grads = torch.autograd.grad((o * go).sum() + (S * gS).sum(), leaves)
    grads_ref = torch.autograd.grad((o_ref * go).sum() + (S_ref * gS).sum(), leaves)
    for name, g, r in zip(("q", "k", "v", "S"), grads, grads_ref):
        assert relative_error(g, r) < 1e-12, name


def test_chunkwise_gradcheck():
    q, k, v, lg, S = make(1, 11, 2, 4, 2, True)
    leaves = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), S.requires_grad_())
    assert torch.autograd.gradcheck(lambda q, k, v, S: retention_chunkwise(q, k, v, lg, S, output_final_state=True,
                                                                                 tile_size=4),
                                    leaves)


@pytest.mark.parametrize("state", [False, True])
def test_steps_match_parallel_form(state):
    q, k, v, lg, S0 = make(2, 23, 3, 6, 4, state)
    o_ref, S_ref = retention_reference(q, k, v, lg, S0, output_final_state=True)
    S, outs = S0, []
    for t in range(q.shape[1]):
        o_t, S = retention_step(q[:, t], k[:, t], v[:, t], lg, S)
        outs.append(o_t)
    assert relative_error(torch.stack(outs, 1), o_ref) < 1e-12 and relative_error(S, S_ref) < 1e-12


def test_continuing_in_pieces():
    q, k, v, lg, S0 = make(2, 100, 2, 4, 4, True)
    o_ref, S_ref = retention_reference(q, k, v, lg, S0, output_final_state=True)
    S, outs = S0, []
    for a, b in ((0, 37), (37, 38), (38, 100)):
        o, S = retention_chunkwise(q[:, a:b], k[:, a:b], v[:, a:b], lg, S, output_final_state=True,
                                   tile_size=16)
        outs.append(o)
    assert relative_error(torch.cat(outs, 1), o_ref) < 1e-12 and relative_error(S, S_ref) < 1e-12


def test_float32_close_to_float64():
    q, k, v, lg, S = make(2, 300, 2, 8, 8, True)
    o_ref, S_ref = retention_reference(q, k, v, lg, S, output_final_state=True)
    o, S32 = retention_chunkwise(*(t.float() for t in (q, k, v, lg, S)), output_final_state=True)
    assert o.dtype == S32.dtype == torch.float32
    assert relative_error(o.double(), o_ref) < 1e-5 and relative_error(S32.double(), S_ref) < 1e-5


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_bad_tile_size(bad):
    with pytest.raises(ValueError, match=r"tile_size: expected a positive int, got"):
        retention_chunkwise(*make(1, 5, 1, 2, 2, False), tile_size=bad)


@pytest.mark.parametrize("value, got", [(float("nan"), "NaN"), (0.25, "a maximum of 0.25"), (float("inf"), "inf"),
                                        (float("-inf"), r"-inf \(a decay of 0\)")])
@pytest.mark.parametrize("form", ["chunkwise", "reference", "step"])
def test_bad_decay_values_are_refused_in_one_line(form, value, got):
    """γ must be in (0, 1]: NaN, a positive log and ±inf are refused (−inf gave NaN outputs: γ^0 = exp(0·−inf)),
    unless the caller says the values are right by construction, as the model does."""
    q, k, v, lg, S = make(1, 5, 2, 2, 4, True)
    lg = lg.clone()
    lg[1] = value
    call = {"chunkwise": lambda **kw: retention_chunkwise(q, k, v, lg, S, **kw),
            "reference": lambda **kw: retention_reference(q, k, v, lg, S),
            "step": lambda **kw: retention_step(q[:, 0], k[:, 0], v[:, 0], lg, S, **kw)}[form]
    with pytest.raises(ValueError, match=rf"^log_decay: expected finite values <= 0 \(the log of a decay in "
                                         rf"\(0, 1\]\), got {got}$"):
        call()
    if form != "reference":
        call(check_values=False)  # not checked: the numbers are the caller's


def test_empty_sequence_passes_the_state():
    q, k, v, lg, S = make(2, 0, 3, 4, 6, True)
    o, S2 = retention_chunkwise(q, k, v, lg, S, output_final_state=True)
    assert o.shape == (2, 0, 3, 6) and torch.equal(S2, S) and S2.data_ptr() != S.data_ptr()  # a copy
    _, S0 = retention_chunkwise(q, k, v, lg, output_final_state=True)
    assert S0.shape == (2, 3, 4, 6) and not S0.any()
    assert retention_chunkwise(q, k, v, lg, S)[1] is None


@pytest.mark.parametrize("form", [retention_chunkwise, retention_reference])
def test_final_state_only_when_asked(form):
    q, k, v, lg, S = make(2, 9, 2, 4, 6, True)
    o, final = form(q, k, v, lg, S)
    assert final is None
    o2, final2 = form(q, k, v, lg, S, output_final_state=True)
    assert torch.equal(o, o2) and final2.shape == (2, 2, 4, 6)


def test_bfloat16_inputs_keep_their_dtype_and_a_float32_state():
    q, k, v, lg, S = make(1, 70, 2, 4, 4, True)
    o, final = retention_chunkwise(q.bfloat16(), k.bfloat16(), v.bfloat16(), lg.float(), S.float(),
                                   output_final_state=True, tile_size=16)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
