"""HybridConfig: validation names the field, presets, sizes, round trips."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hybrid import Attention, AttentionConfig, RecurrenceConfig, RetentionConfig, RotaryConfig, VORecurrence
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
        (dict(window=0), r"window: expected a positive int or None, got 0"),
        ({"attention.window": 0}, r"attention.window: expected a positive int or None, got 0"),
        ({"attention": {"window": 0}}, r"attention.window: expected a positive int or None, got 0"),
        (dict(retention_chunk=0), r"retention_chunk: expected a positive int, got 0"),
        (dict(rotary_dim=5), r"rotary_dim: expected an even int >= 2 \(rotary pairs\), at most head_dim=32, got 5"),
        (dict(rotary_dim=40), r"rotary_dim: expected an even int >= 2 \(rotary pairs\), at most head_dim=32, got 40"),
        (dict(rope_placement="kq"), r"rope_placement: expected one of"),
        (dict(rope_layout="split"), r"rope_layout: expected one of \['interleaved', 'half'\], got 'split'"),
        ({"rotary.layout": "split"}, r"rotary.layout: expected one of \['interleaved', 'half'\], got 'split'"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "bogus": 1}),
         r"^rope_scaling\[.bogus.\] is not a key of rope_type .yarn."),
        (dict(rope_scaling="yarn"), r"rope_scaling: expected a dict or None"),
        (dict(shared_kv=True, rope_placement="qk"), r"shared_kv: expected rope_placement in .*got rope_placement='qk'"),
        (dict(shared_kv=True, rope_placement="vo"), r"shared_kv: .*'vo'"),
        ({"attention.shared_kv": True, "attention.placement": "vo"},
         r"attention.shared_kv: expected attention.placement in .*got attention.placement='vo'"),
        (dict(rnn_r_min=0.99, rnn_r_max=0.9), r"rnn_r_min, rnn_r_max: expected 0 < rnn_r_min <= rnn_r_max < 1"),
        (dict(rnn_r_max=1.0), r"rnn_r_min, rnn_r_max"),
        (dict(rnn_phase="dynamic"), r"rnn_phase: expected one of \['static', 'learned', 'carope', 'data', None\], got 'dynamic'"),
        (dict(rnn_phase_map="sigmoid"),
         r"rnn_phase_map: expected one of \['pi-sigmoid', '2pi-tanh', 'pi-hardsigmoid', 'real-sign'\], got 'sigmoid'"),
        (dict(rnn_selective=True, rnn_selective_gate="hard"), r"rnn_selective_gate: expected one of \['sigmoid', 'hardsigmoid'\], got 'hard'"),
        (dict(rnn_selective_gate="hardsigmoid"), r"rnn_selective_gate: has no effect without rnn_selective=True"),
        ({"recurrence": {"selective_gate": "hardsigmoid"}},
         r"recurrence.selective_gate: has no effect without recurrence.selective=True"),
        (dict(rnn_phase="carope", rope_scaling={"rope_type": "linear", "factor": 2.0}), r"rnn_phase: CARoPE has no"),
        (dict(carope=True, rope_scaling={"rope_type": "linear", "factor": 2.0}), r"carope: CARoPE has no context-extension"),
        (dict(carope=True, rope_placement="none"),
         r"carope: expected rope_placement to rotate something .*got rope_placement='none'"),
        (dict(window=3, **{"attention.window": 4}), r"attention.window: also given as window"),
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


def flat_dict(config: HybridConfig) -> dict:
    """The config as code before the sections wrote it: the stack's fields and the old flat names."""
    return {name: getattr(config, name) for name in HybridConfig.field_names() if "." not in name}


def test_sections_nest_and_old_flat_names_stay_readable():
    c = HybridConfig.preset("hybrid", window=16, rnn_phase="data", retention_chunk=8)
    assert isinstance(c.attention, AttentionConfig) and isinstance(c.recurrence, RecurrenceConfig)
    assert isinstance(c.retention, RetentionConfig) and isinstance(c.rotary, RotaryConfig)
    assert (c.attention.window, c.recurrence.phase, c.retention.tile_size) == (16, "data", 8)
    assert (c.window, c.rnn_phase, c.retention_chunk, c.rope_base) == (16, "data", 8, 10000.0)  # the aliases
    d = c.to_dict()
    assert d["attention"]["window"] == 16 and d["rotary"]["base"] == 10000.0 and "window" not in d
    assert HybridConfig.from_dict(d) == c
    assert HybridConfig.from_dict(flat_dict(c)) == c  # a config saved before the sections
    assert HybridConfig.from_dict(json.loads(json.dumps(d))) == c


def test_every_spelling_sets_the_same_field():
    want = HybridConfig.preset("hybrid", window=16)
    assert HybridConfig.preset("hybrid", **{"attention.window": 16}) == want
    assert HybridConfig.preset("hybrid", attention={"window": 16, "placement": "qkvo"}) == want
    assert HybridConfig.preset("hybrid", attention=AttentionConfig(window=16)) == want
    assert HybridConfig.preset("hybrid").replace(**{"attention.window": 16}) == want
    assert HybridConfig.preset("hybrid", window=8).replace(attention=AttentionConfig(window=16)) == want
    assert HybridConfig(rotary=RotaryConfig(base=500.0)).rope_base == 500.0
    assert HybridConfig(**{"rotary.base": 500.0}) == HybridConfig(rope_base=500.0)
    names = HybridConfig.field_names()
    assert {"d_model", "attention.window", "rotary.base", "retention.tile_size", "window", "rope_base",
            "retention_chunk", "rnn_phase"} <= set(names)
    for name in names:  # each name sets a field that reads back
        section, _, f = name.partition(".")
        value = HybridConfig().section(section) if f else None
        assert f == "" or hasattr(value, f), name


def test_the_config_is_immutable():
    c = HybridConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.attention.window = 4
    assert c.replace(d_model=64).d_model == 64 and c.d_model == 128


def test_old_configs_with_rnn_learnable_theta_still_load():
    old = flat_dict(HybridConfig.preset("vo-rnn"))
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


def test_options_are_checked_once_against_the_shape():
    """A mixer and HybridConfig run the same check_with: the same condition, the same message."""
    with pytest.raises(ValueError, match=r"rotary_dim: expected an even int >= 2 \(rotary pairs\), at most head_dim=8"):
        Attention(16, 2, rotary_dim=10)
    with pytest.raises(ValueError, match=r"attention.rotary_dim: expected an even int >= 2 \(rotary pairs\), at most"):
        HybridConfig(d_model=16, n_heads=2, **{"attention.rotary_dim": 10})
    with pytest.raises(ValueError, match=r"^phase: CARoPE has no context-extension scaling"):
        VORecurrence(16, 2, phase="carope", rotary=RotaryConfig(scaling={"rope_type": "linear", "factor": 2.0}))


def test_the_state_is_fixed_unless_a_mixer_declares_it_grows():
    """``state_is_fixed`` reads the used mixers' ``state_grows``: only global attention grows."""
    assert HybridConfig(pattern="RM").state_is_fixed and HybridConfig(pattern="RA", window=4).state_is_fixed
    assert not HybridConfig(pattern="RA").state_is_fixed
