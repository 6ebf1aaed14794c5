"""Test-wide setup.

Without a GPU, every Triton kernel runs under Triton's CPU interpreter. The variable must be set before
any module that defines a kernel is imported, hence here, before test collection.
"""
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _take_this_workers_share_of_the_cpus() -> None:
    """Under pytest-xdist (`make test`), each of N workers gets 1/N of the CPUs for its torch threads, and so do
    the processes its tests start (OMP_NUM_THREADS): N workers each spinning a thread per CPU only contend."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ["OMP_NUM_THREADS"] = str(share)


_take_this_workers_share_of_the_cpus()

# `python -m pytest` (make test) puts the checkout's root first on sys.path, where kernels/, models/ and train/
# import under their folder names. transformers probes for the published `kernels` package and, finding our folder
# with no metadata, imports it: a second copy of hybrid.kernels whose ops register hybrid::complex_scan again, so the
# op then ran that copy's code (tests/kernels/test_complex_scan_triton.py::test_outputs_fully_written, which patches
# hybrid.kernels.complex_scan.triton_scan, saw nothing called once any test module had imported transformers). The
# library installs `hybrid` only (docs/design.md, "One installed namespace"); the tests import it as users do.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]


def _round_fma_once_in_the_interpreter() -> None:
    """Make the interpreter's ``tl.fma`` round once, as a GPU's does. Triton 3.8 and older interpret it as a
    multiply then an add (two roundings; 3.9 fixed this). torch 2.13 pins triton 3.7.1, so a fresh install has
    it, and the kernels' fma-based reduction of large angles then fails tests/kernels on an interpreter
    artefact rather than on the kernels' arithmetic. Here an fp32 fma is computed in float64, where the product
    of two fp32 numbers is exact, and rounded to fp32 (one rounding, but for rare double-rounding ties)."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = interpreter.InterpreterBuilder
    unfused = builder.create_fma

    def handle(v):
        return interpreter.TensorHandle(np.array([v], dtype=np.float32), tl.float32)

    a = 1.0 + 2.0 ** -12  # a·a = 1 + 2^-11 + 2^-24: fused, a·a − (1 + 2^-11) is 2^-24; unfused it rounds to 0
    try:
        if unfused(builder.__new__(builder), handle(a), handle(a), handle(-(1.0 + 2.0 ** -11))).data[0] != 0.0:
            return  # this Triton already rounds once
    except Exception:  # an interpreter whose builder cannot be probed this way: leave it as it is
        return

    def create_fma(self, x, y, z):
        if z.data.dtype != np.float32:
            return unfused(self, x, y, z)
        wide = x.data.astype(np.float64) * y.data.astype(np.float64) + z.data.astype(np.float64)
        return interpreter.TensorHandle(wide.astype(np.float32), z.dtype.scalar)

    builder.create_fma = create_fma


if os.environ.get("TRITON_INTERPRET") == "1":
    _round_fma_once_in_the_interpreter()


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for a test on tiny tensors: there, a second thread only contends, and on a shared
    2-core machine two threads spinning against another process made such tests 10 to 40 times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class _GraphRecorder:
    """A ``torch.compile`` backend that runs each of Dynamo's graphs as traced and keeps it in ``graphs``: how a
    test counts compiles and sees what reached the compiler, without Inductor's time."""

    def __init__(self):
        self.graphs: list = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


@pytest.fixture
def graph_recorder():
    """``graph_recorder()``: a new recording backend (``_GraphRecorder``); its ``graphs`` fill as Dynamo compiles."""
    return _GraphRecorder


# CI installs every optional extra (.ci/run sets HYBRID_NO_SKIPS=1): there a test that skips for a missing
# package is a check that silently did not run, so it fails instead. Only the GPU's absence may skip, and the
# packages CI deliberately leaves out, each registered here with the reason its skip gives (the same string).
ALLOWED_SKIPS = (
    # wandb: in the `wandb` extra, not in `test` (62 MB, a Go service per run, a dozen dependencies, and the
    # test reads its private run-file format; pyproject.toml); tests/train/test_tracking.py skips its W&B test.
    "wandb not installed (the wandb extra is not in the test extra)",
)


def _skip_is_a_failure(report) -> bool:
    if os.environ.get("HYBRID_NO_SKIPS") != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return False
    reason = str(report.longrepr)
    return "cuda" not in reason.lower() and not any(allowed in reason for allowed in ALLOWED_SKIPS)


def _fail_skip(report):
    report.outcome = "failed"
    report.longrepr = f"skipped, but HYBRID_NO_SKIPS=1 (CI installs every extra): {report.longrepr}"


def pytest_collectreport(report):
    if _skip_is_a_failure(report):
        _fail_skip(report)



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if _skip_is_a_failure(report):
        _fail_skip(report)
