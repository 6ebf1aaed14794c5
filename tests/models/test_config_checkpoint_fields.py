"""HybridConfig fields for imported checkpoints: ``mlp_hidden`` and ``attention_bias`` (defaults change nothing)."""
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM

TINY = dict(d_model=32, n_layers=3, n_heads=2, vocab_size=41)


def test_defaults_leave_the_model_as_before():
    config = HybridConfig.preset("hybrid", **TINY)
    assert config.mlp_hidden is None and config.attention_bias is False
    model = HybridLM(config)
    names = dict(model.named_parameters())
    assert not any(n.endswith("in_proj.bias") or n.endswith("out_proj.bias") for n in names)
    assert model.blocks[0].mlp.hidden == 96  # 8/3 · 32 rounded up to a multiple of 32
    flat = {name: getattr(config, name) for name in HybridConfig.field_names() if "." not in name}
    old = {k: v for k, v in flat.items() if k not in ("mlp_hidden", "attention_bias")}
    assert HybridConfig.from_dict(old) == config  # configs saved before these fields load unchanged


def test_mlp_hidden_sets_the_swiglu_width():
    model = HybridLM(HybridConfig.preset("transformer", **TINY, mlp_hidden=40))
    assert all(b.mlp.w_up.weight.shape == (40, 32) and b.mlp.w_down.weight.shape == (32, 40) for b in model.blocks)


def test_attention_bias_adds_projection_biases_and_keeps_the_modes_equal():
    torch.manual_seed(0)
    model = HybridLM(HybridConfig.preset("hybrid", **TINY, window=3, attention_bias=True, dtype="float64")).eval()
    attn = model.blocks[2].mixer
    assert attn.in_proj.bias.shape == (3 * 32,) and attn.out_proj.bias.shape == (32,)
    assert not attn.in_proj.bias.any()  # zero at init, like every bias of HybridLM
    with torch.no_grad():
        attn.in_proj.bias.normal_()
        attn.out_proj.bias.normal_()
        ids = torch.randint(0, 41, (2, 7))
        parallel, _ = model(ids)
        recurrent, _ = model(ids, mode="recurrent")
        model.blocks[2].mixer.in_proj.bias.zero_()
        changed, _ = model(ids)
    torch.testing.assert_close(recurrent, parallel, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(changed, parallel)


@pytest.mark.parametrize("field, value, message", [
    ("mlp_hidden", 0, "mlp_hidden: expected a positive int or None, got 0"),
    ("mlp_hidden", 2.5, "mlp_hidden: expected a positive int or None, got 2.5"),
    ("attention_bias", "yes", "attention_bias: expected True or False, got 'yes'"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        HybridConfig(**{field: value})
