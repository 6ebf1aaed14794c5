"""A bfloat16 / float16 model's R and G layers keep their angles float32, as its rotary layers do."""
import torch

from hybrid.gla import VOGatedLinearAttention
from hybrid.recurrence import VORecurrence


def test_a_bfloat16_models_r_and_g_layers_rotate_by_float32_angles():
    for layer in (VORecurrence(16, 2), VOGatedLinearAttention(16, 2, decay="static")):
        want = layer.theta.clone()
        layer.to(torch.bfloat16)
        assert layer.theta.dtype == torch.float32 and torch.equal(layer.theta, want)
        layer.to(torch.float64)
        assert torch.equal(layer.theta, want.double())
