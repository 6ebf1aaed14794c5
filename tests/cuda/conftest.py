"""The CUDA tests: every test here is marked ``cuda`` (``pytest -m cuda`` selects them on a GPU) and skips,
saying why, where no CUDA device is visible. The comparisons are those of the GPU check's correctness part
(``hybrid.train.bench.gpu_check.numerics``), asserted against the same tolerances."""
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    no_cuda = pytest.mark.skip(reason="needs a CUDA device (none visible); on a GPU: pytest -m cuda, docs/gpu.md")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(no_cuda)
    # the CUDA-graph tests last: a capture that fails can leave the process's CUDA context unusable, and the
    # other CUDA tests (the scan, windows, conv, compile) should have run by then
    items.sort(key=lambda item: "graphed" in item.fspath.basename)


@pytest.fixture
def cuda():
    return torch.device("cuda")
