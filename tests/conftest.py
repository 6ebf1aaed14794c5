"""Test-wide setup.

Without a GPU, every Triton kernel runs under Triton's CPU interpreter. The variable must be set before
any module that defines a kernel is imported, hence here, before test collection.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for a test on tiny tensors: there, a second thread only contends, and on a shared
    2-core machine two threads spinning against another process made such tests 10 to 40 times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# CI installs every optional extra (.ci/run sets HYBRID_NO_SKIPS=1): there a test that skips for a missing
# package is a check that silently did not run, so it fails instead. Only the GPU's absence may skip.
def _skip_is_a_failure(report) -> bool:
    if os.environ.get("HYBRID_NO_SKIPS") != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return False
    return "cuda" not in str(report.longrepr).lower()


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
