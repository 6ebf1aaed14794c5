"""CARoPE phases and data-phase logits stay float32 under bf16 autocast (docs/design.md, "Conventions")."""
import torch

from hybrid.rotary import DataPhase
from hybrid.rotary.carope import CARoPE, wrap_phase


def test_carope_phases_are_float32_under_autocast_and_keep_counting_past_256():
    torch.manual_seed(0)
    m = CARoPE(16, 2, 8)
    with torch.no_grad():
        m.weight.normal_(0, 0.2)
    x = torch.randn(1, 600, 16)
    want, _ = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, end = m(x)
        _, end2 = m(x[:, :1], end)  # a decode step continues the float32 phase
    assert got.dtype == end.dtype == end2.dtype == torch.float32
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(end, wrap_phase(want[:, -1]))
    # pair 0 advances by exactly 1 rad a token; a bf16 phase stalled (it cannot count past 256 by ones)
    torch.testing.assert_close(wrap_phase(end2[..., 0] - end[..., 0]), torch.ones_like(end[..., 0]))


def test_data_phase_logits_are_float32_under_autocast():
    torch.manual_seed(0)
    m = DataPhase(16, torch.rand(2, 4))
    with torch.no_grad():
        m.weight.normal_(0, 0.3)
    x = torch.randn(1, 9, 16)
    want = m.logits(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = m.logits(x)
    torch.testing.assert_close(got, want)
