"""The Triton scan on the GPU against float64: forward, final state and the gradients of x, log_decay, theta
and the initial state, in fp32 / bf16 / fp16, static / data-dependent / mixed decay and angle, lengths from 1 to
65,536 (an autotuned size among them), and packed rows with boundaries at, before and after every time tile."""
import pytest

# the cases live beside the comparisons, where the prewarm (gpu_check.prewarm) reads them too
from hybrid.train.bench.gpu_check.numerics import (DTYPES, LONG_CASES, MODES, PACKED_AUTOTUNED, PACKED_EDGES,
                                                   PACKED_MODES, SHORT_LENGTHS, SPLIT_CASES, packed_edge_case,
                                                   scan_errors, short_case, split_case_errors, tolerance_for,
                                                   windows_as_rows_errors)


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


@pytest.mark.parametrize("case", SPLIT_CASES, ids=["fp32", "bf16"])
def test_split_in_time(cuda, case):
    """A row cut into pieces (kernels/complex_scan/time_split.py), as "auto" cuts few long rows on a GPU: the same
    errors against float64 as one pass, initial state and all four gradients included."""
    assert_within(split_case_errors(cuda, case), case[0])


def test_auto_splits_one_long_row_of_an_r_layer(cuda):
    """One row of 65,536 steps through 8 heads of 64: 16 programs, split on any GPU of 64 SMs or more."""
    from hybrid.kernels.complex_scan.time_split import pieces_for

    assert pieces_for(1, 65536, 8, 32, cuda, "triton") > 1


def test_windows_packed_by_documents_run_as_rows(cuda):
    """The trainer's packed batch (windows, each starting a document) scanned as a row per window
    (``PackedOffsets.row_len``): outputs and gradients against each sequence run alone in float64."""
    errors = windows_as_rows_errors(cuda)
    assert all(e < 1e-5 for e in errors.values()), errors
