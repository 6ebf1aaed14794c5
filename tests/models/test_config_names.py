"""How a user names a HybridConfig field (models/config_names.py): stack names, dotted section fields and old flat
names parse to one key each; errors are respelled in the user's names."""
import pytest

from hybrid import AttentionConfig, RecurrenceConfig, RotaryConfig
from hybrid.models import HybridConfig
from hybrid.models.config_names import FLAT_ALIASES, FLAT_NAMES, options_fields, parse, respell, spellings

STACK = ("d_model", "pattern")
SECTIONS = {"attention": AttentionConfig, "rotary": RotaryConfig, "recurrence": RecurrenceConfig}


def test_flat_aliases_name_real_section_fields_once():
    sections = {name: type(HybridConfig().section(name)) for name in HybridConfig.section_names()}
    for flat, (section, field) in FLAT_ALIASES.items():
        assert field in options_fields(sections[section]), flat
    assert len(FLAT_NAMES) == len(FLAT_ALIASES) and all(FLAT_ALIASES[FLAT_NAMES[key]] == key for key in FLAT_NAMES)
    assert options_fields(RotaryConfig) == ("base", "scaling", "layout", "carope")


def test_parse_maps_every_spelling_to_one_key():
    values = {"d_model": 64, "window": 8, "rotary.base": 500.0, "recurrence": {"phase": "data"},
              "attention": AttentionConfig(placement="qk")}
    with pytest.raises(ValueError, match=r"^attention.window: also given as window; expected one of the two$"):
        parse(values, STACK, SECTIONS)  # "attention" given whole includes its window
    del values["attention"]
    out, spelled, unknown = parse({**values, "colour": "red", "rotary.colour": 1}, STACK, SECTIONS)
    assert out == {"d_model": 64, ("attention", "window"): 8, ("rotary", "base"): 500.0,
                   ("recurrence", "phase"): "data"}
    assert spelled == {"d_model": "d_model", ("attention", "window"): "window", ("rotary", "base"): "rotary.base",
                       ("recurrence", "phase"): "recurrence.phase"}
    assert unknown == ["colour", "rotary.colour"]
    whole, _, _ = parse({"attention": AttentionConfig(window=4)}, STACK, SECTIONS)
    assert whole[("attention", "window")] == 4 and len(whole) == len(options_fields(AttentionConfig))
    nested, _, unknown = parse({"mixers": {"attention": {"window": 2}, "toy": {}}}, STACK, SECTIONS)
    assert nested == {("attention", "window"): 2} and unknown == ["mixers.toy"]  # the nesting of dataclasses.asdict
    assert parse({"retention_chunk": 4}, STACK, SECTIONS)[2] == ["retention_chunk"]  # its section is not given


def test_parse_errors():
    with pytest.raises(ValueError, match=r"^rope_base: also given as rotary.base; expected one of the two$"):
        parse({"rotary.base": 500.0, "rope_base": 400.0}, STACK, SECTIONS)
    with pytest.raises(ValueError, match=r"^attention: expected a AttentionConfig or a dict of its fields, got int$"):
        parse({"attention": 3}, STACK, SECTIONS)


def test_spellings_follow_the_user():
    fields = ("window", "placement", "bias")
    spelled = {("attention", "window"): "window"}
    assert spellings("attention", fields, spelled, dotted=False) == {
        "window": "window", "placement": "rope_placement", "bias": "attention_bias"}  # old flat names where they exist
    assert spellings("attention", fields, {}, dotted=True) == {
        "window": "attention.window", "placement": "attention.placement", "bias": "attention.bias"}
    assert spellings("recurrence", ("r_min", "norm"), {}, dotted=False) == {
        "r_min": "rnn_r_min", "norm": "recurrence.norm"}  # a field without a flat name: dotted


def test_respell_replaces_whole_words_outside_quotes():
    error = ValueError("shared_kv: expected placement in ('qkvo', 'none'), got placement='vo' (not placements)")
    names = {"shared_kv": "attention.shared_kv", "placement": "rope_placement", "window": "window"}
    assert str(respell(error, names)) == ("attention.shared_kv: expected rope_placement in ('qkvo', 'none'), got "
                                          "rope_placement='vo' (not placements)")
    assert respell(error, {"window": "window"}) is error  # nothing to rename
    assert str(respell(ValueError("'placement' is quoted"), names)) == "'placement' is quoted"
