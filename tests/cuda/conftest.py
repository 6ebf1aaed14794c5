"""The CUDA tests: every test here is marked ``cuda`` (``pytest -m cuda`` selects them on a GPU) and skips,
saying why, where no CUDA device is visible. The comparisons are those of the GPU check's correctness part
(``hybrid.train.bench.gpu_check.numerics``), asserted against the same tolerances."""
import pytest
import torch


# The files' order. What no GPU has run comes before what the GPU check's correctness part has checked there
# since 2026-11-26 (the windows and the conv), so that a run stopped at a time limit (the check's tests part) has
# run the new tests. The CUDA-graph captures come after every other new test: a capture that fails can leave the
# process's CUDA context unusable, failing what runs after it. In each file the tests that compile a model with
# Inductor (``compiled`` in their ids; tens of seconds each on a cold GPU) come last. Any other test (another
# file here, or the rest of the suite, which uses the GPU too when there is one) runs before the captures. A case
# on fla-core's kernels (``-fla-`` in its id: they autotune for a minute or more on first use, unless held to one
# config each, as the GPU check's tests part holds them) goes with the compiles. The decoding loops' syncs (new on
# 2026-11-28, a few seconds) come after the models' tests, before the captures. G against its float64 reference (``test_vo_gla_cuda.py``, fla's kernels, autotuned by the captures'
# G case before it) comes after the captures.
FILE_ORDER = ("test_scan_cuda.py", "test_model_cuda.py", "test_decoding_syncs_cuda.py", "test_graphed_decoding_cuda.py",
              "test_vo_gla_cuda.py", "test_window_conv_cuda.py")
OTHERS = FILE_ORDER.index("test_graphed_decoding_cuda.py") - 0.5


def run_order(item) -> tuple:
    name = item.fspath.basename
    if name not in FILE_ORDER:
        return OTHERS, False
    return FILE_ORDER.index(name), "compiled" in item.nodeid or "-fla-" in item.nodeid


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    no_cuda = pytest.mark.skip(reason="needs a CUDA device (none visible); on a GPU: pytest -m cuda, docs/gpu.md")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(no_cuda)
    items.sort(key=run_order)  # stable: the rest keep their order


@pytest.fixture
def cuda():
    return torch.device("cuda")
