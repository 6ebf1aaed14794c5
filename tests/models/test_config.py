"""HybridConfig: validation names the field, presets, sizes, round trips."""
from __future__ import annotations

import pytest
import torch

from hybrid.models import PRESETS, SIZES, HybridConfig, HybridLM


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(pattern="RXA"), r"pattern: unknown mixer letter\(s\) \['X'\]"),
        (dict(pattern=""), r"pattern: expected a non-empty string"),
        (dict(d_model=130, n_heads=4), r"n_heads: expected a divisor of d_model=130"),
        (dict(d_model=12, n_heads=4), r"head_dim: expected an even int >= 2 \(rotary pairs\), got 3"),
        (dict(head_dim=7), r"head_dim: expected an even int >= 2 \(rotary pairs\), got 7"),
        (dict(n_kv_heads=3), r"n_kv_heads: expected a divisor of n_heads=4, got 3"),
        (dict(window=0), r"window: expected a positive int, got 0"),
        (dict(retention_chunk=0), r"retention_chunk: expected a positive int, got 0"),
        (dict(rotary_dim=5), r"rotary_dim: expected an even int >= 2 \(rotary pairs\), at most head_dim=32, got 5"),
        (dict(rotary_dim=40), r"rotary_dim: expected an even int >= 2 \(rotary pairs\), at most head_dim=32, got 40"),
        (dict(rope_placement="kq"), r"rope_placement: expected one of"),
        (dict(rope_layout="split"), r"rope_layout: expected 'interleaved' or 'half'"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "bogus": 1}), r"rope_scaling: .*bogus"),
        (dict(rope_scaling="yarn"), r"rope_scaling: expected a dict or None"),
        (dict(shared_kv=True, rope_placement="qk"), r"shared_kv: one cached tensor cannot serve .*'qk'"),
        (dict(shared_kv=True, rope_placement="vo"), r"shared_kv: .*'vo'"),
        (dict(rnn_r_min=0.99, rnn_r_max=0.9), r"rnn_r_min, rnn_r_max: expected 0 < rnn_r_min <= rnn_r_max < 1"),
        (dict(rnn_r_max=1.0), r"rnn_r_min, rnn_r_max"),
        (dict(rnn_phase="dynamic"), r"rnn_phase: expected one of \('static', 'learned', 'carope', 'data'\) or None, got 'dynamic'"),
        (dict(rnn_phase_map="sigmoid"),
         r"rnn_phase_map: expected one of \('pi-sigmoid', '2pi-tanh', 'pi-hardsigmoid'\), got 'sigmoid'"),
        (dict(rnn_selective=True, rnn_selective_gate="hard"), r"rnn_selective_gate: expected one of \('sigmoid', 'hardsigmoid'\), got 'hard'"),
        (dict(rnn_selective_gate="hardsigmoid"), r"rnn_selective_gate: has no effect without rnn_selective=True"),
        (dict(rnn_phase="carope", rope_scaling={"rope_type": "linear", "factor": 2.0}), r"rnn_phase: CARoPE has no"),
        (dict(carope=True, rope_scaling={"rope_type": "linear", "factor": 2.0}), r"carope: CARoPE has no context-extension"),
        (dict(carope=True, rope_placement="none"), r"carope: rope_placement='none'"),
        (dict(dtype="float8"), r"dtype: expected one of"),
        (dict(vocab_size=0), r"vocab_size: expected a positive int, got 0"),
        (dict(n_layers=2.0), r"n_layers: expected a positive int, got 2.0"),
        (dict(mlp_ratio=-1.0), r"mlp_ratio: expected a number > 0, got -1.0"),
        (dict(rope_base=0), r"rope_base: expected a number > 1, got 0"),
        (dict(rope_base=0.5), r"rope_base: expected a number > 1, got 0.5"),
        (dict(rope_base=1), r"rope_base: expected a number > 1, got 1"),
        (dict(rope_base=float("nan")), r"rope_base: expected a number > 1, got nan"),
        (dict(shared_kv="yes"), r"shared_kv: expected True or False"),
    ],
)
def test_bad_values_name_the_field(overrides, match):
    with pytest.raises(ValueError, match=match):
        HybridConfig(**overrides)


def test_presets_and_sizes():
    for name in PRESETS:
        for size in SIZES:
            c = HybridConfig.preset(name, size)
            assert c.meta == {"preset": name, "size": size}
            assert c.d_model == SIZES[size]["d_model"]
    assert HybridConfig.preset("transformer").layer_types == "AAAA"
    assert HybridConfig.preset("transformer").rope_placement == "qk"
    assert HybridConfig.preset("transformer").window is None
    assert HybridConfig.preset("retnet").layer_types == "MMMM"
    assert HybridConfig.preset("vo-rnn").layer_types == "RRRR"
    h = HybridConfig.preset("hybrid", "small")
    assert h.layer_types == "RRARRARR" and h.rope_placement == "qkvo" and h.window is not None and h.state_is_fixed
    assert HybridConfig.preset("hybrid", window=32, n_layers=7).layer_types == "RRARRAR"


def test_parameter_counts_of_named_sizes():
    with torch.device("meta"):
        base = HybridLM(HybridConfig.preset("transformer", "base")).num_parameters()
        large = HybridLM(HybridConfig.preset("transformer", "large")).num_parameters()
    assert 110e6 < base < 140e6
    assert 320e6 < large < 390e6


def test_preset_errors():
    with pytest.raises(ValueError, match=r"preset: expected one of .*got 'gpt'"):
        HybridConfig.preset("gpt")
    with pytest.raises(ValueError, match=r"size: expected one of .*got 'huge'"):
        HybridConfig.preset("hybrid", "huge")
    with pytest.raises(ValueError, match=r"config: unknown field\(s\) \['depth'\]"):
        HybridConfig.preset("hybrid", depth=3)


def test_dict_round_trip_and_unknown_keys():
    c = HybridConfig.preset("hybrid", "tiny", rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                              "original_max_position_embeddings": 64})
    assert HybridConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match=r"config: unknown field\(s\) \['colour'\]"):
        HybridConfig.from_dict({**c.to_dict(), "colour": "red"})
    with pytest.raises(ValueError, match=r"config: expected a dict"):
        HybridConfig.from_dict(["d_model"])
    assert c.replace(window=8).window == 8
    with pytest.raises(ValueError, match=r"unknown field"):
        c.replace(depth=2)


def test_rnn_phase_default_follows_carope():
    assert HybridConfig().resolved_rnn_phase == "static"
    assert HybridConfig(carope=True).resolved_rnn_phase == "carope"
    assert HybridConfig(carope=True, rnn_phase="data").resolved_rnn_phase == "data"
    assert HybridConfig(rnn_phase="learned").resolved_rnn_phase == "learned"


def test_old_configs_with_rnn_learnable_theta_still_load():
    old = HybridConfig.preset("vo-rnn").to_dict()
    del old["rnn_phase"], old["rnn_phase_map"]  # a config saved before rnn_phase existed
    assert HybridConfig.from_dict({**old, "rnn_learnable_theta": True}).resolved_rnn_phase == "learned"
    assert HybridConfig.from_dict({**old, "rnn_learnable_theta": False}).resolved_rnn_phase == "static"
    with pytest.raises(ValueError, match=r"rnn_learnable_theta: has no effect with carope=True"):
        HybridConfig.from_dict({**old, "rnn_learnable_theta": True, "carope": True})
    with pytest.raises(ValueError, match=r"rnn_learnable_theta: contradicts rnn_phase='data'"):
        HybridConfig.from_dict({**old, "rnn_learnable_theta": True, "rnn_phase": "data"})
    # the weights of an old learnable-theta model load into the model the upgraded config builds
    torch.manual_seed(0)
    model = HybridLM(HybridConfig.from_dict({**old, "d_model": 16, "n_heads": 2, "n_layers": 1, "rnn_learnable_theta": True}))
    assert "blocks.0.mixer.theta" in model.state_dict()
