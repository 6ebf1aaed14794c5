"""``to_device`` / ``on_device``: the values arrive unchanged, and a copy bound for a CUDA device goes through pinned
memory only where that is safe (not while torch.compile traces, not while a CUDA graph is captured, not when it is
pinned already). Whether the host then runs ahead of the GPU is tested on a GPU:
tests/cuda/test_decoding_syncs_cuda.py."""
import pytest
import torch

from hybrid.kernels import host_copies
from hybrid.kernels.host_copies import on_device, to_device
from hybrid.kernels.varlen import on_device as varlen_on_device


def test_values_arrive_unchanged():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-5, 5, (7, 3), generator=g)
    assert torch.equal(to_device(x, "cpu"), x)
    assert to_device(x, torch.device("cpu")) is x  # already there: no copy
    for dtype in (torch.int64, torch.int32):
        got = on_device([3, 0, 9], "cpu", dtype)
        assert got.dtype == dtype and got.tolist() == [3, 0, 9]
    assert varlen_on_device is on_device  # the ops' import of it


@pytest.fixture
def no_capture(monkeypatch):
    """A CUDA build's answer where no graph is captured (the CPU build's function refuses to run)."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def test_pinned_staging_only_for_host_to_cuda(no_capture):
    cuda, host = torch.device("cuda"), torch.arange(4)
    assert host_copies._through_pinned(host, cuda)
    assert not host_copies._through_pinned(host, torch.device("cpu"))
    assert not host_copies._through_pinned(host.to("meta"), cuda)


def test_no_pinned_staging_while_compiling_or_capturing(monkeypatch, no_capture):
    cuda, host = torch.device("cuda"), torch.arange(4)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not host_copies._through_pinned(host, cuda)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not host_copies._through_pinned(host, cuda)


def test_traced_whole_by_torch_compile():
    f = torch.compile(lambda x: on_device([1, 2, 3], x.device) + x, fullgraph=True, backend="eager")
    assert f(torch.ones(3, dtype=torch.long)).tolist() == [2, 3, 4]
