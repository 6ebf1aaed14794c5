"""Float64 reference formulas for the rotary tests, written out independently of hybrid.rotary."""
import math
import sys

import pytest
import torch


def thetas(dim, base=10000.0):
    """θ_i = base^(−2i/dim) as a float64 tensor (dim/2,)."""
    return torch.tensor([base ** (-2.0 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def rotate(x, angles, layout="interleaved", rotary_dim=None, inverse=False):
    """Complex-number rotation: pair k ↦ z_k·e^{±iφ_k}. x (..., D) float64; angles broadcastable to (..., R/2)."""
    x = x.double()
    R = x.shape[-1] if rotary_dim is None else rotary_dim
    if layout == "interleaved":
        z = torch.complex(x[..., 0:R:2], x[..., 1:R:2])
    else:
        z = torch.complex(x[..., : R // 2], x[..., R // 2 : R])
    z = z * torch.polar(torch.ones_like(angles, dtype=torch.float64), (-1.0 if inverse else 1.0) * angles.double())
    out = x.clone()
    if layout == "interleaved":
        out[..., 0:R:2], out[..., 1:R:2] = z.real, z.imag
    else:
        out[..., : R // 2], out[..., R // 2 : R] = z.real, z.imag
    return out


def softplus(z):
    return math.log1p(math.exp(z)) if z < 30 else z + math.log1p(math.exp(-z))


@pytest.fixture
def ref():
    """The float64 reference formulas above, as a namespace (`ref.rotate`, `ref.thetas`, ...)."""
    return sys.modules[__name__]
