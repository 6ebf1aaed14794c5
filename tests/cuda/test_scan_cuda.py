"""The Triton scan on the GPU against float64: forward, final state and the gradients of x, log_decay, theta
and the initial state, in fp32 / bf16 / fp16, static / data-dependent / mixed decay and angle, lengths from 1 to
65,536 (an autotuned size among them), and packed rows with boundaries at, before and after every time tile."""
import pytest
import torch

from hybrid.train.bench.gpu_check.numerics import scan_errors, tolerance_for

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def assert_within(errors: dict, dtype) -> None:
    bad = {k: v for k, v in errors.items() if not v <= tolerance_for(dtype, k)}
    assert not bad, f"relative errors over tolerance: {bad}"


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("mode", ["static", "dependent", "mixed"])
@pytest.mark.parametrize("T", [1, 2, 63, 65, 1000])
def test_short(cuda, dtype, mode, T):
    assert_within(scan_errors(cuda, dtype, T, mode, seed=T), dtype)


@pytest.mark.parametrize("dtype,T,mode,kw", [
    (F32, 8192, "dependent", {}),
    (BF16, 8192, "dependent", {"B": 4, "H": 4, "D": 64}),  # 2^22 pair-steps: the autotuned kernels
    (F16, 8192, "static", {}),
    (F32, 65536, "dependent", {"B": 1, "H": 2}),
    (BF16, 65536, "mixed", {"B": 1, "H": 2}),
])
def test_long(cuda, dtype, T, mode, kw):
    assert_within(scan_errors(cuda, dtype, T, mode, **kw), dtype)


@pytest.mark.parametrize("edge", [32, 64, 128])
@pytest.mark.parametrize("mode", ["dependent", "mixed", "static"])
def test_packed_boundaries_at_tile_edges(cuda, edge, mode):
    assert_within(scan_errors(cuda, F32, 4 * edge + 3, mode, packed_edge=edge, seed=edge), F32)


def test_packed_autotuned(cuda):
    assert_within(scan_errors(cuda, BF16, 8192, "dependent", packed_edge=64, H=8, D=128), BF16)
