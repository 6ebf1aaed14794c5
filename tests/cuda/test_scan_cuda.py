"""The Triton scan on the GPU against float64: forward, final state and the gradients of x, log_decay, theta
and the initial state, in fp32 / bf16 / fp16, static / data-dependent / mixed decay and angle, lengths from 1 to
65,536 (an autotuned size among them), and packed rows with boundaries at, before and after every time tile."""
import pytest

# the cases live beside the comparisons, where the prewarm (gpu_check.prewarm) reads them too
from hybrid.train.bench.gpu_check.numerics import (DTYPES, LONG_CASES, MODES, PACKED_AUTOTUNED, PACKED_EDGES,
                                                   PACKED_MODES, SHORT_LENGTHS, packed_edge_case, scan_errors,
                                                   short_case, tolerance_for)


def assert_within(errors: dict, dtype) -> None:
    bad = {k: v for k, v in errors.items() if not v <= tolerance_for(dtype, k)}
    assert not bad, f"relative errors over tolerance: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("T", SHORT_LENGTHS)
def test_short(cuda, dtype, mode, T):
    dtype, T, mode, kw = short_case(dtype, T, mode)
    assert_within(scan_errors(cuda, dtype, T, mode, **kw), dtype)


@pytest.mark.parametrize("dtype,T,mode,kw", LONG_CASES)
def test_long(cuda, dtype, T, mode, kw):
    assert_within(scan_errors(cuda, dtype, T, mode, **kw), dtype)


@pytest.mark.parametrize("edge", PACKED_EDGES)
@pytest.mark.parametrize("mode", PACKED_MODES)
def test_packed_boundaries_at_tile_edges(cuda, edge, mode):
    dtype, T, mode, kw = packed_edge_case(edge, mode)
    assert_within(scan_errors(cuda, dtype, T, mode, **kw), dtype)


def test_packed_autotuned(cuda):
    dtype, T, mode, kw = PACKED_AUTOTUNED
    assert_within(scan_errors(cuda, dtype, T, mode, **kw), dtype)
