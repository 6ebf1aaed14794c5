"""The vo_gla op (hybrid.kernels.vo_gla): every way of computing it against the float64 formula.

Fresh random inputs, sizes that are not powers of two, and the gradients w.r.t. q, k, v, the decays, the angles
and the initial state. The chunkwise torch form at every tile size; packed equals separate with boundaries at,
one before and one after every chunk edge and sequences of length 1 and 2; the one-token step; two exact
identities (θ = 0 is simple GLA, fla's ``naive_chunk_simple_gla`` where it imports; one key channel with
q ≡ k ≡ 1 is ``complex_scan``); float32 keeps its precision at long lengths (chunk-local phases).
torch.compile, the backend choice and the fla adapter: tests/kernels/test_vo_gla_op.py.
"""
from __future__ import annotations

import importlib
import itertools

import pytest
import torch

from hybrid.kernels import complex_scan
from hybrid.kernels.vo_gla import vo_gla, vo_gla_reference, vo_gla_step

F64 = torch.float64
_seed = itertools.count(4601)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Tiny tensors: a second thread only contends (tests/conftest.py)."""


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def inputs(B, T, H=3, Dk=5, Dv=6, *, selective=True, data_phase=True, init=True, n_states=None, dtype=F64):
    """q, k, v, log_decay ((B, T, H) or (H,)), theta ((B, T, H, P) or (H, P)), initial state or None."""
    P = Dv // 2
    q = torch.randn(B, T, H, Dk, generator=gen(), dtype=dtype)
    k = torch.randn(B, T, H, Dk, generator=gen(), dtype=dtype) * Dk**-0.5
    v = torch.randn(B, T, H, Dv, generator=gen(), dtype=dtype)
    shape = (B, T, H) if selective else (H,)
    log_decay = -torch.rand(*shape, generator=gen(), dtype=dtype) * 0.7  # γ in (0.5, 1]: far tokens still count
    theta = torch.rand(*((B, T, H, P) if data_phase else (H, P)), generator=gen(), dtype=dtype) * 3.1  # (0, π)
    S = torch.randn(n_states or B, H, Dk, Dv, generator=gen(), dtype=dtype) if init else None
    return q, k, v, log_decay, theta, S


def relative_error(got, want) -> float:
    scale = want.abs().max()
    return ((got - want).abs().max() / scale).item() if scale > 0 else got.abs().max().item()


def outputs_and_grads(fn, q, k, v, log_decay, theta, S, final=True, cotangents=None):
    """fn's o (and final state) and the gradients of a random loss on them (``cotangents``: the weights of o and
    of the final state; default drawn here) w.r.t. every input."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, log_decay, theta)]
    leaves += [S.detach().clone().requires_grad_()] if S is not None else []
    o, f = fn(*leaves[:5], leaves[5] if S is not None else None)
    assert (f is None) == (not final)
    if cotangents is None:
        g = torch.Generator().manual_seed(7)
        cotangents = (torch.randn(o.shape, generator=g, dtype=o.dtype),
                      torch.randn(f.shape, generator=g, dtype=f.dtype) if final else None)
    loss = (o * cotangents[0]).sum()
    if final:
        loss = loss + (f * cotangents[1]).sum()
    return [o] + ([f] if final else []) + list(torch.autograd.grad(loss, leaves))


def assert_all_close(got, want, tol=1e-11):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        assert relative_error(a, b) < tol, (i, relative_error(a, b))


# ------------------------------------------------------------------------------------------ the torch form


@pytest.mark.parametrize("selective,data_phase", [(True, True), (False, False), (True, False), (False, True)])
@pytest.mark.parametrize("init", [True, False])
def test_chunkwise_equals_the_reference_at_every_tile_size(selective, data_phase, init):
    B, T = 2, 23
    args = inputs(B, T, selective=selective, data_phase=data_phase, init=init)
    want = outputs_and_grads(lambda *a: vo_gla_reference(*a, output_final_state=True), *args)
    for tile in (1, 2, 5, 8, 22, 23, 64):
        got = outputs_and_grads(lambda *a: vo_gla(*a, output_final_state=True, tile_size=tile), *args)
        assert_all_close(got, want)
    o, f = vo_gla(*args, tile_size=5)  # no final state asked: none built
    assert f is None and relative_error(o, want[0]) < 1e-11


def edge_lens(C: int, chunks: int = 3, tail: int = 2) -> list[int]:
    """Boundaries at jC − 1, jC and jC + 1 for every chunk edge j, plus sequences of length 1 and 2."""
    cuts = sorted({p for j in range(1, chunks + 1) for p in (j * C - 1, j * C, j * C + 1)})
    T = chunks * C + tail
    ends = [p for p in cuts if 0 < p < T] + [T]
    return [1, 2] + [b - a for a, b in zip([0] + ends, ends)] + [2 * C + 1, 1]


@pytest.mark.parametrize("tile", [3, 4, 5])
def test_packed_equals_separate(tile):
    lens = edge_lens(tile)
    T, N = sum(lens), len(lens)
    cu = torch.tensor([0, *itertools.accumulate(lens)])
    q, k, v, log_decay, theta, S = inputs(1, T, n_states=N)
    cot_o, cot_f = torch.randn(1, T, 3, 6, generator=gen(), dtype=F64), torch.randn(S.shape, generator=gen(), dtype=F64)
    got = outputs_and_grads(lambda *a: vo_gla(*a, output_final_state=True, cu_seqlens=cu, tile_size=tile),
                            q, k, v, log_decay, theta, S, cotangents=(cot_o, cot_f))
    # each sequence alone through the formula, its outputs, states and gradients concatenated
    parts = []
    for n, (a, b) in enumerate(itertools.pairwise(cu.tolist())):
        parts.append(outputs_and_grads(lambda *x: vo_gla_reference(*x, output_final_state=True),
                                       q[:, a:b], k[:, a:b], v[:, a:b], log_decay[:, a:b], theta[:, a:b],
                                       S[n:n + 1], cotangents=(cot_o[:, a:b], cot_f[n:n + 1])))
    want = [torch.cat([p[i] for p in parts], dim=0 if i in (1, 7) else 1) for i in range(8)]
    assert_all_close(got, want)
    # and the packed reference agrees (its own loop over sequences)
    assert_all_close(got[:2], list(vo_gla_reference(q, k, v, log_decay, theta, S, output_final_state=True,
                                                    cu_seqlens=cu)))


def test_packed_without_initial_states_and_static_parameters():
    lens = [1, 2, 9, 4, 1]
    cu = torch.tensor([0, *itertools.accumulate(lens)])
    q, k, v, log_decay, theta, _ = inputs(1, sum(lens), selective=False, data_phase=False, init=False)
    want = outputs_and_grads(lambda *a: vo_gla_reference(*a, output_final_state=True, cu_seqlens=cu),
                             q, k, v, log_decay, theta, None)
    got = outputs_and_grads(lambda *a: vo_gla(*a, output_final_state=True, cu_seqlens=cu, tile_size=4),
                            q, k, v, log_decay, theta, None)
    assert_all_close(got, want)


def test_an_empty_sequence_passes_the_state_through():
    q, k, v, log_decay, theta, S = inputs(2, 0)
    o, f = vo_gla(q, k, v, log_decay, theta, S, output_final_state=True)
    assert o.shape == (2, 0, 3, 6) and torch.equal(f, S) and f.data_ptr() != S.data_ptr()
    o, f = vo_gla(q, k, v, log_decay, theta, None, output_final_state=True)
    assert not f.any() and f.shape == S.shape


# ------------------------------------------------------------------------------------------ the step


@pytest.mark.parametrize("selective,data_phase", [(True, True), (False, False)])
def test_steps_equal_the_reference(selective, data_phase):
    B, T = 2, 9
    args = inputs(B, T, selective=selective, data_phase=data_phase)

    def stepped(q, k, v, log_decay, theta, S):
        outs = []
        for t in range(T):
            lg = log_decay[:, t] if selective else log_decay
            th = theta[:, t] if data_phase else theta
            o_t, S = vo_gla_step(q[:, t], k[:, t], v[:, t], lg, th, S)
            outs.append(o_t)
        return torch.stack(outs, dim=1), S

    want = outputs_and_grads(lambda *a: vo_gla_reference(*a, output_final_state=True), *args)
    assert_all_close(outputs_and_grads(stepped, *args), want)
    # from no state at all (zeros)
    want = outputs_and_grads(lambda *a: vo_gla_reference(*a, output_final_state=True), *args[:5], None)
    assert_all_close(outputs_and_grads(stepped, *args[:5], None), want)


# ------------------------------------------------------------------------------------------ identities


def simple_gla_loop(q, k, v, g, S):
    """Simple GLA token by token (S_t = γ_t S_{t−1} + k_t ⊗ v_t, o_t = q_t S_t), written here independently."""
    outs = []
    for t in range(q.shape[1]):
        S = torch.exp(g[:, t])[..., None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhd,bhde->bhe", q[:, t], S))
    return torch.stack(outs, dim=1), S


def test_theta_zero_is_simple_gla():
    """θ = 0: vo_gla is simple GLA, exactly; checked against a plain loop and, where fla imports, fla's own naive
    chunked form (which computes in float32)."""
    q, k, v, log_decay, theta, S = inputs(2, 21)
    zero = torch.zeros_like(theta)
    o, f = vo_gla(q, k, v, log_decay, zero, S, output_final_state=True, tile_size=4)
    want_o, want_f = simple_gla_loop(q, k, v, log_decay, S)
    assert relative_error(o, want_o) < 1e-12 and relative_error(f, want_f) < 1e-12
    try:
        naive = importlib.import_module("fla.ops.simple_gla.naive").naive_chunk_simple_gla
    except Exception:  # fla-core is an optional extra; the loop above is then the oracle
        return
    fla_o, fla_f = naive(q, k, v, log_decay, initial_state=S.float(), output_final_state=True, chunk_size=8,
                         scale=1.0)
    assert relative_error(o, fla_o.double()) < 1e-5 and relative_error(f, fla_f.double()) < 1e-5


def test_one_key_channel_with_unit_q_and_k_is_the_complex_scan():
    """Dk = 1, q ≡ k ≡ 1: S is one complex number per value pair, S_t = γ_t e^{−iθ_t} S_{t−1} + v_t, o_t = S_t —
    complex_scan with the head's decay on every pair."""
    B, T, H, Dv = 2, 19, 3, 8
    _, _, v, log_decay, theta, _ = inputs(B, T, H, Dk=1, Dv=Dv)
    ones = torch.ones(B, T, H, 1, dtype=F64)
    S0 = torch.randn(B, H, 1, Dv, generator=gen(), dtype=F64)
    for init in (None, S0):
        o, f = vo_gla(ones, ones, v, log_decay, theta, init, output_final_state=True, tile_size=5)
        scan_init = None if init is None else init[:, :, 0]
        y, s = complex_scan(v, log_decay[..., None].expand(B, T, H, Dv // 2), theta, scan_init,
                            output_final_state=True, backend="reference")
        assert relative_error(o, y) < 1e-12 and relative_error(f[:, :, 0], s) < 1e-12


# ------------------------------------------------------------------------------------------ precision


def test_float32_keeps_its_precision_at_long_lengths():
    """The phase is chunk-local: at 12K tokens with angles up to π per token (a whole phase of 3.7·10⁴ rad),
    float32 stays as close to float64 as at 300 tokens (≈ 1e-5). A float32 phase summed over the whole sequence
    would be off by up to 2e-3 rad there, and so would the outputs."""
    errors = []
    for T in (300, 12000):
        q, k, v, log_decay, theta, S = inputs(1, T, H=1, Dk=2, Dv=4, selective=False, data_phase=False)
        log_decay = torch.full((1,), -1e-2, dtype=F64)  # a memory of ~100 tokens: the error does not grow with it
        theta = torch.tensor([[3.1, 1.7]], dtype=F64)
        want, _ = vo_gla(q, k, v, log_decay, theta, S)
        got, _ = vo_gla(*(x.float() for x in (q, k, v, log_decay, theta, S)))
        errors.append(relative_error(got.double()[:, -200:], want[:, -200:]))
    assert errors[1] < 3e-5 and errors[1] < 3 * errors[0], errors


def test_outputs_keep_the_input_dtype_and_states_are_float32():
    q, k, v, log_decay, theta, S = inputs(1, 7, dtype=torch.bfloat16)
    o, f = vo_gla(q, k, v, log_decay, theta, S.float(), output_final_state=True)
    assert o.dtype == torch.bfloat16 and f.dtype == torch.float32
    o, S1 = vo_gla_step(q[:, 0], k[:, 0], v[:, 0], log_decay[:, 0], theta[:, 0], None)
    assert o.dtype == torch.bfloat16 and S1.dtype == torch.float32


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("change,match", [
    (lambda a: {**a, "v": a["v"][..., :5]}, r"^v: expected an even value head size Dv \(rotary pairs\), got Dv=5$"),
    (lambda a: {**a, "k": a["k"][:, :3]}, r"^k: expected shape \(2, 4, 3, 5\) \(the shape of q\), got \(2, 3, 3, 5\)$"),
    (lambda a: {**a, "log_decay": a["log_decay"][..., :2]},
     r"^log_decay: expected a shape that broadcasts to \(B, T, H\) = \(2, 4, 3\), got \(2, 4, 2\)$"),
    (lambda a: {**a, "theta": a["theta"][..., :2]},
     r"^theta: expected a shape that broadcasts to \(B, T, H, Dv/2\) = \(2, 4, 3, 3\), got \(2, 4, 3, 2\)$"),
    (lambda a: {**a, "log_decay": a["log_decay"].abs() + 0.1},
     r"^log_decay: expected finite values <= 0 \(the log of a decay in \(0, 1\]\), got a maximum of"),
    (lambda a: {**a, "log_decay": torch.full_like(a["log_decay"], float("-inf"))},
     r"^log_decay: expected finite values <= 0 \(the log of a decay in \(0, 1\]\), got -inf \(a decay of 0\)$"),
    (lambda a: {**a, "log_decay": torch.full_like(a["log_decay"], float("inf"))},
     r"^log_decay: expected finite values <= 0 \(the log of a decay in \(0, 1\]\), got inf$"),
    (lambda a: {**a, "theta": a["theta"] * float("nan")}, r"^theta: expected finite angles, got 72 NaN and 0 inf$"),
    (lambda a: {**a, "initial_state": a["initial_state"][:1]},
     r"^initial_state: expected shape \(B, H, Dk, Dv\) = \(2, 3, 5, 6\), got \(1, 3, 5, 6\)$"),
    (lambda a: {**a, "q": a["q"].long()}, r"^q: expected a floating dtype \(float32, bfloat16, float16, float64\), "
                                          r"got torch.int64$"),
    (lambda a: {**a, "tile_size": 0}, r"^tile_size: expected a positive int, got 0$"),
    (lambda a: {**a, "backend": "cuda"}, r"^backend: expected one of \('fla', 'torch', 'reference'\) or 'auto', "
                                         r"got 'cuda'$"),
])
def test_bad_input_is_one_line(change, match):
    q, k, v, log_decay, theta, S = inputs(2, 4)
    args = change(dict(q=q, k=k, v=v, log_decay=log_decay, theta=theta, initial_state=S))
    with pytest.raises(ValueError, match=match):
        vo_gla(**args)


def test_packed_input_errors_name_cu_seqlens_and_the_states():
    q, k, v, log_decay, theta, S = inputs(1, 6, n_states=2)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected offsets ending at total_T=6, got 5$"):
        vo_gla(q, k, v, log_decay, theta, S, cu_seqlens=torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match=r"^initial_state: expected shape \(N, H, Dk, Dv\) \(one per sequence\) = "
                                         r"\(3, 3, 5, 6\), got \(2, 3, 5, 6\)$"):
        vo_gla(q, k, v, log_decay, theta, S, cu_seqlens=torch.tensor([0, 2, 5, 6]))
    with pytest.raises(ValueError, match=r"^state: expected shape \(B, H, Dk, Dv\) = \(1, 3, 5, 6\), got"):
        vo_gla_step(q[:, 0], k[:, 0], v[:, 0], log_decay[:, 0], theta[:, 0], S)
