"""Window / global attention backends and the causal conv on the GPU against their float64 references."""
import pytest
import torch

from hybrid.train.bench.gpu_check.numerics import conv_errors, window_errors
from hybrid.train.bench.gpu_check.part_correctness import CONV_TOL, WINDOW_TOL, _window_backends


def backend_dtypes():
    """Each backend the GPU has with each dtype it takes (flash-attn: fp16 / bf16 only)."""
    found = _window_backends(torch.device("cuda")) if torch.cuda.is_available() else ["blocked", "flex"]
    return [(b, dt) for b in found for dt in (torch.float32, torch.bfloat16)
            if not (b == "flash" and dt == torch.float32)]


@pytest.mark.parametrize("backend,dtype", backend_dtypes(), ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("window", [None, 1, 64, 800])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_window_backends(cuda, backend, dtype, window, packed):
    errors = window_errors(cuda, dtype, backend, 777, window, packed=packed, seed=window or 0)
    assert max(errors.values()) <= WINDOW_TOL[dtype], errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_conv(cuda, dtype, packed):
    from hybrid.kernels.causal_conv.interface import select_conv_backend

    for backend in {"torch", select_conv_backend(cuda, 64, 4, dtype)}:
        errors = conv_errors(cuda, dtype, backend, packed=packed)
        assert max(errors.values()) <= CONV_TOL[dtype], (backend, errors)
