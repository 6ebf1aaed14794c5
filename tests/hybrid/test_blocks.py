"""RMSNorm, the per-head RMS norm and SwiGLU."""
import pytest
import torch
import torch.nn.functional as F

from hybrid.mlp import SwiGLU, swiglu_hidden
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


@pytest.mark.parametrize(
    "d,want", [(64, 192), (128, 352), (512, 1376), (768, 2048), (96, 256), (10, 32)]
)
def test_swiglu_hidden_rule(d, want):
    assert swiglu_hidden(d) == want
    assert SwiGLU(d).hidden == want


def test_swiglu_hidden_options():
    assert swiglu_hidden(100, mlp_ratio=4, multiple_of=64) == 448
    assert swiglu_hidden(100, multiple_of=1) == 267  # ceil(266.67)
    assert SwiGLU(16, hidden=50).hidden == 50  # an explicit width is used as given


def test_swiglu_matches_formula_and_grads():
    torch.manual_seed(0)
    m = SwiGLU(12, hidden=20, bias=True).to(F64)
    x = torch.randn(2, 3, 12, dtype=F64)
    ref = m.w_down(F.silu(m.w_gate(x)) * m.w_up(x))
    ref2 = (F.silu(x @ m.w_gate.weight.T + m.w_gate.bias) * (x @ m.w_up.weight.T + m.w_up.bias)) @ m.w_down.weight.T
    torch.testing.assert_close(m(x), ref, rtol=0, atol=0)
    torch.testing.assert_close(m(x), ref2 + m.w_down.bias, rtol=1e-12, atol=1e-12)
    m(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())
    assert SwiGLU(12).w_gate.bias is None
    assert SwiGLU(12).bfloat16()(x.bfloat16()).dtype == torch.bfloat16


def test_swiglu_bad_args():
    with pytest.raises(ValueError, match="d_model"):
        SwiGLU(0)
    with pytest.raises(ValueError, match="hidden"):
        SwiGLU(8, hidden=0)
    with pytest.raises(ValueError, match="mlp_ratio"):
        SwiGLU(8, mlp_ratio=-1.0)
    with pytest.raises(ValueError, match="multiple_of"):
        SwiGLU(8, multiple_of=0)
    with pytest.raises(ValueError, match="x"):
        SwiGLU(8)(torch.randn(2, 7))
