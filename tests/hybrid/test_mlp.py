"""SwiGLU and its hidden-width rule (hybrid.mlp)."""
import pytest
import torch
import torch.nn.functional as F

from hybrid.mlp import SwiGLU, swiglu_hidden


F64 = torch.float64


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
