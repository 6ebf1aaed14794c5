"""vo_gla as a custom op, its backend choice and the fla adapter.

``hybrid::vo_gla`` traces whole under ``torch.compile(fullgraph=True)`` (plain and packed, with and without
states) and the compiled forward and backward equal eager; ``torch.library.opcheck`` checks the registrations.
fla-core runs only on CUDA, which CI lacks, so its adapter is run here on the CPU against a stand-in for fla's
``chunk_simple_gla`` / ``fused_recurrent_simple_gla`` (simple GLA computed by this package's formula with θ = 0):
what is checked is the arithmetic around fla's call (the phase, the turns, the state's frame) and the selection.
"""
from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from hybrid.kernels.vo_gla import fla as fla_module  # (hybrid.kernels.vo_gla is also the function's name)
from hybrid.kernels.vo_gla import interface
from hybrid.kernels.vo_gla import BACKEND_ENV, resolve_backend, vo_gla, vo_gla_reference, vo_gla_step
from hybrid.kernels.vo_gla.fla import vo_gla_fla, vo_gla_step_fla
from hybrid.kernels.vo_gla.op import forward, vo_gla_op
from hybrid.kernels.vo_gla.rotation import sequence_phase

F64 = torch.float64
_seed = itertools.count(8801)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Tiny tensors: a second thread only contends (tests/conftest.py)."""


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seed))


def inputs(B, T, H=2, Dk=3, Dv=4, n_states=None):
    q = torch.randn(B, T, H, Dk, generator=gen(), dtype=F64)
    k = torch.randn(B, T, H, Dk, generator=gen(), dtype=F64)
    v = torch.randn(B, T, H, Dv, generator=gen(), dtype=F64)
    log_decay = -torch.rand(B, T, H, generator=gen(), dtype=F64) * 0.5
    theta = torch.rand(B, T, H, Dv // 2, generator=gen(), dtype=F64) * 3
    S = torch.randn(n_states or B, H, Dk, Dv, generator=gen(), dtype=F64)
    return q, k, v, log_decay, theta, S


def relative_error(got, want) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


# ------------------------------------------------------------------------------------------ compile


@pytest.mark.parametrize("packed", [False, True])
def test_fullgraph_compile_equals_eager(packed):
    torch.compiler.reset()
    lens = [1, 6, 2, 8]
    cu = torch.tensor([0, *itertools.accumulate(lens)]) if packed else None
    q, k, v, log_decay, theta, S = inputs(1 if packed else 2, sum(lens), n_states=len(lens) if packed else None)

    def fn(q, k, v, log_decay, theta, S):
        o, f = vo_gla(q, k, v, log_decay, theta, S, output_final_state=True, cu_seqlens=cu, tile_size=4,
                      check_values=False)
        return (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum() + f.square().sum()

    def loss_and_grads(f):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, log_decay, theta, S)]
        loss = f(*leaves)
        return [loss.detach()] + list(torch.autograd.grad(loss, leaves))

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")  # raises on any graph break
    for got, want in zip(loss_and_grads(compiled), loss_and_grads(fn)):
        assert relative_error(got, want) < 1e-12
    torch.compiler.reset()


def test_opcheck_passes():
    """The fake, the autograd registration and the schema agree with the implementation."""
    q, k, v, log_decay, theta, S = inputs(1, 5)
    lens = torch.tensor([0, 2, 5])
    S2 = torch.randn(2, *S.shape[1:], generator=gen(), dtype=F64)
    cases = [(q, k, v, log_decay, theta, S, None, 2, True, "torch"),
             (q, k, v, log_decay, theta, S2, lens, 3, True, "torch"),
             (q, k, v, log_decay[:1, :1], theta[:1, :1], None, None, 4, False, "torch")]
    for args in cases:
        args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in args)
        torch.library.opcheck(vo_gla_op, args, test_utils=("test_schema", "test_faketensor",
                                                            "test_autograd_registration"))


# ------------------------------------------------------------------------------------------ backend choice


@pytest.fixture
def fake_fla(monkeypatch):
    """fla's two functions as a stand-in, reported as importable."""
    ops = SimpleNamespace(chunk=fake_chunk_simple_gla, recurrent=fake_fused_recurrent_simple_gla,
                          takes_host_offsets=fla_module.takes_host_offsets(fake_chunk_simple_gla))
    monkeypatch.setattr(interface, "fla_ops", lambda: ops)
    monkeypatch.setattr(fla_module, "fla_ops", lambda: ops)
    return ops


def test_auto_picks_fla_only_where_it_imports_and_can_run(fake_fla, monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_backend(None, cuda, torch.bfloat16, 64, 64) == "fla"
    assert resolve_backend("auto", cuda, torch.float32, 256, 128) == "fla"
    assert resolve_backend(None, cpu, torch.float32, 64, 64) == "torch"  # no CUDA
    assert resolve_backend(None, cuda, torch.float64, 64, 64) == "torch"  # fla has no float64 kernels
    assert resolve_backend(None, cuda, torch.float32, 512, 64) == "torch"  # head too large for its tiles
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert resolve_backend(None, cuda, torch.bfloat16, 64, 64) == "torch"  # the variable wins over auto
    assert resolve_backend("fla", cuda, torch.bfloat16, 64, 64) == "fla"  # the call wins over the variable
    monkeypatch.setenv(BACKEND_ENV, "triton")
    with pytest.raises(ValueError, match=r"^HYBRID_GLA_BACKEND: expected one of \('auto', 'fla', 'torch', "
                                         r"'reference'\), got 'triton'$"):
        resolve_backend(None, cuda, torch.bfloat16, 64, 64)
    with pytest.raises(ValueError, match=r"^backend: 'fla' was asked for but it needs CUDA tensors, got tensors on "
                                         r"cpu$"):
        resolve_backend("fla", cpu, torch.float32, 64, 64)


def test_without_fla_auto_is_torch_and_fla_is_refused(monkeypatch):
    monkeypatch.setattr(interface, "fla_ops", lambda: None)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert resolve_backend(None, torch.device("cuda"), torch.bfloat16, 64, 64) == "torch"
    with pytest.raises(ValueError, match=r"^backend: 'fla' was asked for but fla-core does not import "
                                         r"\(pip install fla-core\)$"):
        resolve_backend("fla", torch.device("cuda"), torch.bfloat16, 64, 64)


def test_fla_ops_is_none_or_the_two_functions():
    ops = fla_module.fla_ops()
    assert ops is None or (callable(ops.chunk) and callable(ops.recurrent))


def test_the_reference_backend_is_the_formula():
    q, k, v, log_decay, theta, S = inputs(2, 7)
    got = vo_gla(q, k, v, log_decay, theta, S, output_final_state=True, backend="reference")
    want = vo_gla_reference(q, k, v, log_decay, theta, S, output_final_state=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


# ------------------------------------------------------------------------------------------ the fla adapter

CALLS = []


def fake_chunk_simple_gla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False,
                          cu_seqlens=None, cu_seqlens_cpu=None):
    """fla's chunk_simple_gla's arguments and meaning (g: (B, T, H) log decay; states (N, H, K, V); fla-core 0.6's
    host copy of the offsets), computed by the formula with θ = 0."""
    if cu_seqlens_cpu is not None:
        assert cu_seqlens_cpu.device.type == "cpu" and torch.equal(cu_seqlens_cpu, cu_seqlens.cpu())
    CALLS.append(dict(g_shape=tuple(g.shape), scale=scale, cu=cu_seqlens, host=cu_seqlens_cpu is not None))
    theta = torch.zeros(*v.shape[:-1], v.shape[-1] // 2, dtype=v.dtype)
    return vo_gla_reference(q * scale, k, v, g, theta, initial_state, output_final_state=output_final_state,
                            cu_seqlens=cu_seqlens)


def fake_fused_recurrent_simple_gla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False):
    return fake_chunk_simple_gla(q, k, v, g=g, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state)


@pytest.mark.parametrize("packed,static", [(False, False), (True, False), (False, True), (True, True)])
def test_the_fla_adapter_equals_the_reference(fake_fla, packed, static):
    """Turning the values by the sequence's phase around (fake) simple GLA and the outputs and final states back
    gives vo_gla's numbers, packed and plain, with static and per-token angles and decays, and their gradients."""
    lens = [1, 5, 2, 9]
    cu = torch.tensor([0, *itertools.accumulate(lens)]) if packed else None
    B = 1 if packed else 2
    q, k, v, log_decay, theta, S = inputs(B, sum(lens), n_states=len(lens) if packed else None)
    if static:
        log_decay, theta = log_decay[0, 0], theta[0, 0]  # (H,), (H, P)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, log_decay, theta, S)]
    g, th = leaves[3].reshape(1, 1, -1) if static else leaves[3], leaves[4][None, None] if static else leaves[4]
    CALLS.clear()
    o, f = vo_gla_fla(*leaves[:3], g, th, leaves[5], cu, True)
    assert CALLS == [dict(g_shape=(B, sum(lens), 2), scale=1.0, cu=cu, host=False)]
    want_o, want_f = vo_gla_reference(*leaves, output_final_state=True, cu_seqlens=cu)
    assert relative_error(o, want_o) < 1e-6 and relative_error(f, want_f) < 1e-6  # float32 phase and turns
    weights = torch.randn(o.shape, generator=gen(), dtype=F64)
    got = torch.autograd.grad((o * weights).sum() + f.sum(), leaves)
    want = torch.autograd.grad((want_o * weights).sum() + want_f.sum(), leaves)
    for a, b in zip(got, want):
        assert relative_error(a, b) < 1e-5


def test_checked_offsets_reach_fla_on_the_host(fake_fla):
    """A ``PackedOffsets`` (the model's) gives an fla that takes ``cu_seqlens_cpu`` (fla-core 0.6) its host copy, so
    fla lays out its chunks without reading the offsets back; an older fla (no such argument) gets none."""
    from hybrid.kernels.varlen import PackedOffsets

    lens = [3, 1, 6]
    bounds = [0, *itertools.accumulate(lens)]
    q, k, v, log_decay, theta, S = inputs(1, sum(lens), n_states=len(lens))
    offsets = PackedOffsets.from_bounds(bounds, device="cpu")
    want = vo_gla(q, k, v, log_decay, theta, S, output_final_state=True, cu_seqlens=offsets, backend="torch")
    CALLS.clear()
    got = forward(q.float(), k.float(), v.float(), log_decay.float(), theta.float(), S.float(), offsets, 64, True,
                  "fla")
    assert CALLS[-1]["host"] and torch.equal(CALLS[-1]["cu"], offsets.cu_seqlens)
    assert relative_error(got[0].double(), want[0]) < 1e-5 and relative_error(got[1].double(), want[1]) < 1e-5
    assert fla_module.takes_host_offsets(lambda q, k, v, cu_seqlens=None, cu_seqlens_cpu=None: None)
    assert not fla_module.takes_host_offsets(lambda q, k, v, cu_seqlens=None, **kwargs: None)
    fake_fla.takes_host_offsets = False
    forward(q.float(), k.float(), v.float(), log_decay.float(), theta.float(), S.float(), offsets, 64, True, "fla")
    assert not CALLS[-1]["host"]


def test_the_fla_step_equals_the_torch_step(fake_fla):
    q, k, v, log_decay, theta, S = inputs(2, 1)
    args = (q[:, 0], k[:, 0], v[:, 0], log_decay[:, 0], theta[:, 0])
    for state in (S, None):
        o, S1 = vo_gla_step_fla(*args, state)
        want_o, want_S = vo_gla_step(*args, state, backend="torch")
        assert relative_error(o, want_o) < 1e-6 and relative_error(S1, want_S) < 1e-6


def test_the_absolute_phase_is_summed_in_float64_and_wrapped():
    """sequence_phase restarts with each sequence and keeps float32 precision at 10⁵ tokens."""
    T = 100_000
    theta = torch.tensor([[[[3.0, 0.001]]]], dtype=torch.float32)  # (1, 1, H=1, P=2): static
    phase = sequence_phase(theta, T, None)
    exact = torch.remainder(torch.arange(1, T + 1, dtype=F64)[:, None] * theta.double()[0, 0, 0], 2 * math.pi)
    err = torch.remainder(phase[0, :, 0].double() - exact + math.pi, 2 * math.pi) - math.pi
    assert phase.dtype == torch.float32 and err.abs().max() < 1e-6
    per_token = torch.rand(1, 9, 2, 3, generator=gen())
    cu = torch.tensor([0, 4, 5, 9])
    got = sequence_phase(per_token, 9, cu)
    for a, b in itertools.pairwise(cu.tolist()):
        assert torch.allclose(got[:, a:b], torch.remainder(per_token[:, a:b].double().cumsum(1), 2 * math.pi).float())
