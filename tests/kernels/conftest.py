"""Fixtures shared by the op tests."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode  # torch has no public path for it


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces (``largest``)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.fixture
def largest_tensor():
    """A factory of ``LargestTensor`` probes: ``with largest_tensor() as probe: …; probe.largest``."""
    return LargestTensor
