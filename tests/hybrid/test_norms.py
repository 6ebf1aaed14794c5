"""RMSNorm and the per-head RMS norm (hybrid.norms)."""
import pytest
import torch

from hybrid.norms import RMSNorm, head_rms_norm, rms_norm


F64 = torch.float64


def test_rmsnorm_matches_formula():
    torch.manual_seed(0)
    m = RMSNorm(7, eps=1e-5).to(F64)
    assert torch.equal(m.weight, torch.ones(7, dtype=F64))
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(3, 5, 7, dtype=F64)
    ref = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * m.weight
    torch.testing.assert_close(m(x), ref, rtol=1e-12, atol=1e-12)


def test_rmsnorm_low_precision_computes_in_fp32():
    torch.manual_seed(0)
    m = RMSNorm(33)
    x = (torch.randn(4, 33) * 300).half()  # x² overflows fp16 (max 65504); fp32 compute does not
    y = m(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    ref = rms_norm(x.float(), m.weight)
    torch.testing.assert_close(y.float(), ref, rtol=2e-3, atol=2e-3)
    mb = RMSNorm(33).bfloat16()
    assert mb(x.bfloat16()).dtype == torch.bfloat16


def test_head_rms_norm_per_head_and_scale_invariant():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 6, dtype=F64)
    y = head_rms_norm(x, eps=0.0)
    torch.testing.assert_close((y**2).mean(-1), torch.ones(2, 5, 3, dtype=F64), rtol=1e-12, atol=1e-12)
    c = torch.rand(2, 5, 3, 1, dtype=F64) * 10 + 0.1
    torch.testing.assert_close(head_rms_norm(x * c, eps=0.0), y, rtol=1e-12, atol=1e-12)


def test_norm_gradients():
    m = RMSNorm(5).to(F64)
    x = torch.randn(2, 3, 5, dtype=F64, requires_grad=True)
    w = m.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-6), (x, w))


def test_norm_bad_args():
    with pytest.raises(ValueError, match="dim"):
        RMSNorm(0)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(4, eps=-1.0)
    with pytest.raises(ValueError, match="x"):
        RMSNorm(4)(torch.randn(2, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_is_the_written_formula_to_the_bit_on_the_cpu(dtype, weighted):
    """``rms_norm`` goes through ``F.rms_norm`` (one fused kernel on CUDA); on the CPU its values and gradients are
    the bits of the formula written out in at least float32, odd sizes."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 33, generator=g, dtype=F64).to(dtype).requires_grad_()
    w = torch.randn(33, generator=g, dtype=F64).to(dtype).requires_grad_() if weighted else None
    grad_out = torch.randn(3, 7, 33, generator=g, dtype=F64).to(dtype)

    def written(x, w):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
        return (y if w is None else y * w.to(xf.dtype)).to(x.dtype)

    inputs = [x] if w is None else [x, w]
    got, want = rms_norm(x, w), written(x, w)
    assert torch.equal(got, want)
    for a, b in zip(torch.autograd.grad(got, inputs, grad_out), torch.autograd.grad(want, inputs, grad_out)):
        assert torch.equal(a, b)
