"""at_least_float32 (hybrid/precision.py): low-precision floats are raised to float32, wider dtypes kept."""
import pytest
import torch

from hybrid.precision import at_least_float32


@pytest.mark.parametrize("dtype,expected", [
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
    (torch.float32, torch.float32), (torch.float64, torch.float64),
])
def test_at_least_float32(dtype, expected):
    t = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = at_least_float32(t)
    assert out.dtype == expected and out.shape == t.shape
    assert torch.equal(out, t.to(expected))  # exact: every low-precision value is a float32 value
    if dtype == expected:
        assert out is t  # nothing copied

