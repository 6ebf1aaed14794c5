"""G's CUDA path: ``vo_gla`` and ``vo_gla_step`` on fla-core's kernels against the float64 reference (on the CPU)
and against the torch form on the GPU, outputs, final states and the gradients of every input (docs/gpu.md, "The
G mixer", checks 1 and 2). The CPU suite runs the fla adapter against a stand-in for fla's functions only
(tests/kernels/test_vo_gla_op.py), so a mismatch in fla's conventions (the ``g`` layout, ``scale``, the state
layout) shows here first.

Tolerances, relative to each tensor's largest entry: fla in float32 5e-3, since its Triton dots take float32
operands at tf32 (a 10-bit mantissa; torch's ``allow_tf32`` does not reach them); fla in bfloat16 2e-2; the torch
form in float32 3e-5 (its matmuls in full float32: 1e-6 to 6e-6 on the CPU). A convention fla reads otherwise
than the adapter (a sign, a layout, a scale) is off by far more. Head sizes 32, the ``tiny`` G model's, so that
fla's autotuning (minutes of device time on first use, keyed by the head sizes) serves the CUDA-graph test of G
too."""
from __future__ import annotations

import itertools

import pytest
import torch

from hybrid.kernels.vo_gla import BACKEND_ENV, resolve_backend, vo_gla, vo_gla_reference, vo_gla_step

F64 = torch.float64
H, DK, DV = 2, 32, 32
LENGTHS = [1, 33, 64, 19]  # packed: a one-token sequence, and ends inside and at fla's 64-token chunks
TOLERANCE = {("fla", torch.float32): 5e-3, ("fla", torch.bfloat16): 2e-2, ("torch", torch.float32): 3e-5}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| / max |want|, in float64 on the CPU."""
    got = got.detach().double().cpu()
    return ((got - want).abs().max() / want.abs().max()).item()


def fla_or_skip():
    pytest.importorskip("fla", reason="fla-core is not installed (the GPU check carries it as a wheel: docs/gpu.md)")


def inputs(seed: int, B: int, T: int, n_states: int, per_token: bool) -> list[torch.Tensor]:
    """q, k, v, log γ, θ and the initial states, float64 on the CPU: decays and angles per token ``(B, T, H[, P])``
    or static per head ``(H[, P])``; angles up to π a token."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, DK, generator=g, dtype=F64) * DK ** -0.5
    k = torch.randn(B, T, H, DK, generator=g, dtype=F64)
    v = torch.randn(B, T, H, DV, generator=g, dtype=F64)
    shape = (B, T, H) if per_token else (H,)
    log_decay = -torch.rand(*shape, generator=g, dtype=F64) * 0.3
    theta = torch.rand(*shape, DV // 2, generator=g, dtype=F64) * torch.pi
    S = torch.randn(n_states, H, DK, DV, generator=g, dtype=F64) * 0.1
    return [q, k, v, log_decay, theta, S]


def outputs_and_grads(leaves, cu, **kw) -> list[torch.Tensor]:
    """o, the final states and the gradients of q, k, v, log γ, θ and the initial states, of a fixed weighted sum
    of o and the final states, all as float64 on the CPU."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    o, final = vo_gla(*leaves, output_final_state=True, cu_seqlens=cu, **kw)
    weight_o = torch.linspace(-1, 1, o.numel(), dtype=F64).reshape(o.shape).to(o.device)
    weight_s = torch.linspace(1, -1, final.numel(), dtype=F64).reshape(final.shape).to(final.device)
    loss = (o.double() * weight_o).sum() + (final.double() * weight_s).sum()
    grads = torch.autograd.grad(loss, leaves)
    return [t.detach().double().cpu() for t in (o, final, *grads)]


NAMES = ["o", "final state", "dq", "dk", "dv", "dlog_decay", "dtheta", "dinitial_state"]


def compare(device, backend: str, dtype: torch.dtype, packed: bool, per_token: bool) -> None:
    """``vo_gla(backend=...)`` on ``device`` in ``dtype`` against the float64 reference on the CPU, every output and
    gradient within ``TOLERANCE`` (the body of the CUDA test; rehearsed on the CPU with the torch form)."""
    B, T = (1, sum(LENGTHS)) if packed else (2, 67)
    cu = torch.tensor([0, *itertools.accumulate(LENGTHS)]) if packed else None
    leaves = inputs(11 + 2 * packed + per_token, B, T, len(LENGTHS) if packed else B, per_token)
    want = outputs_and_grads(leaves, cu, backend="reference")
    moved = [t.to(device, dtype if i < 3 else torch.float32) for i, t in enumerate(leaves)]  # q, k, v in dtype
    got = outputs_and_grads(moved, None if cu is None else cu.to(device), backend=backend, check_values=False)
    tolerance = TOLERANCE[(backend, dtype)]
    errors = {name: relative_error(g, w) for name, g, w in zip(NAMES, got, want)}
    bad = {name: f"{e:.2e}" for name, e in errors.items() if not e <= tolerance}
    assert not bad, f"{backend} {dtype}: relative errors above {tolerance:g}: {bad}"


def test_fla_is_g_default_on_cuda(monkeypatch):
    fla_or_skip()
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert resolve_backend(None, torch.device("cuda"), torch.bfloat16, 64, 64) == "fla"
    assert resolve_backend(None, torch.device("cuda"), torch.float32, DK, DV) == "fla"


def steps_against_the_reference(device, backend: str) -> None:
    """Eight steps of ``vo_gla_step(backend=...)`` from a random state, float32, against the float64 reference over
    the same tokens: every output and the last state."""
    B, T = 3, 8
    q, k, v, log_decay, theta, S = inputs(31, B, T, B, per_token=True)
    o_want, s_want = vo_gla_reference(q, k, v, log_decay, theta, S, output_final_state=True)
    state, outs = S.float().to(device), []
    for t in range(T):
        o, state = vo_gla_step(*(x[:, t].float().to(device) for x in (q, k, v, log_decay, theta)), state,
                               backend=backend, check_values=False)
        outs.append(o)
    tolerance = TOLERANCE[(backend, torch.float32)]
    for name, got, want in (("o", torch.stack(outs, dim=1), o_want), ("state", state, s_want)):
        error = relative_error(got, want)
        assert error <= tolerance, f"{backend} step, {name}: relative error {error:.2e} above {tolerance:g}"


def test_vo_gla_step_against_the_float64_reference(cuda):
    fla_or_skip()
    steps_against_the_reference(cuda, "fla")


# last: fla's backward kernels autotune on first use (the CUDA-graph test before this file tuned the forward ones)
@pytest.mark.parametrize("per_token", [False, True], ids=["static", "per-token"])
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("backend, dtype", [("torch", torch.float32), ("fla", torch.float32),
                                            ("fla", torch.bfloat16)], ids=["torch-fp32", "fla-fp32", "fla-bf16"])
def test_vo_gla_against_the_float64_reference(cuda, backend, dtype, packed, per_token):
    if backend == "fla":
        fla_or_skip()
    compare(cuda, backend, dtype, packed, per_token)
