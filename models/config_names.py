"""How a user names a `HybridConfig` field, and errors that answer in the user's names.

Three spellings reach one value:

    stack fields          "d_model", "pattern", ...                      HybridConfig.d_model
    dotted section fields "attention.window", "rotary.base", ...         HybridConfig.attention.window
    old flat names        "window", "rope_base", "rnn_phase", ...        (configs saved before the sections)

A section is given whole as an options object or a dict of its fields (`attention=AttentionConfig(...)`,
`{"attention": {"window": 8}}`), or field by field. `parse` maps any mix to keys — a stack name, or
`(section, field)` — and remembers how each was spelled; `respell` rewrites a section's error (raised with its
plain field names) into those spellings.
"""
from __future__ import annotations

import dataclasses
import re

# old flat name → (section, field): the configs and checkpoints written before the sections, and the
# compatibility aliases `config.window`, `config.rope_base`, ... read through
FLAT_ALIASES: dict[str, tuple[str, str]] = {
    "n_kv_heads": ("attention", "n_kv_heads"),
    "window": ("attention", "window"),
    "shared_kv": ("attention", "shared_kv"),
    "attention_bias": ("attention", "bias"),
    "rope_placement": ("attention", "placement"),
    "rotary_dim": ("attention", "rotary_dim"),
    "rope_base": ("rotary", "base"),
    "rope_scaling": ("rotary", "scaling"),
    "rope_layout": ("rotary", "layout"),
    "carope": ("rotary", "carope"),
    "rnn_r_min": ("recurrence", "r_min"),
    "rnn_r_max": ("recurrence", "r_max"),
    "rnn_selective": ("recurrence", "selective"),
    "rnn_selective_gate": ("recurrence", "selective_gate"),
    "rnn_phase": ("recurrence", "phase"),
    "rnn_phase_map": ("recurrence", "phase_map"),
    "rnn_conv_width": ("recurrence", "conv_width"),
    "retention_chunk": ("retention", "tile_size"),
}
FLAT_NAMES = {key: name for name, key in FLAT_ALIASES.items()}  # (section, field) → old flat name


def options_fields(cls: type) -> tuple[str, ...]:
    """The fields of an options dataclass."""
    return tuple(f.name for f in dataclasses.fields(cls))


def parse(values: dict, stack: tuple[str, ...], sections: dict[str, type]) -> tuple[dict, dict, list[str]]:
    """User-given names → (`{key: value}`, `{key: the name as given}`, unknown names); a key is a stack name or
    `(section, field)`. The same key given twice (e.g. "window" and "attention.window") is an error."""
    out, spelled, unknown = {}, {}, []

    def put(key, value, name):
        if key in out:
            raise ValueError(f"{name}: also given as {spelled[key]}; expected one of the two")
        out[key], spelled[key] = value, name

    def put_section(section, value):
        cls = sections[section]
        if isinstance(value, cls):
            for f in options_fields(cls):
                put((section, f), getattr(value, f), f"{section}.{f}")
        elif isinstance(value, dict):
            for f, v in value.items():
                if f in options_fields(cls):
                    put((section, f), v, f"{section}.{f}")
                else:
                    unknown.append(f"{section}.{f}")
        else:
            raise ValueError(f"{section}: expected a {cls.__name__} or a dict of its fields, got "
                             f"{type(value).__name__}")

    for name, value in values.items():
        section, _, f = name.partition(".")
        if name in stack:
            put(name, value, name)
        elif name in FLAT_ALIASES and FLAT_ALIASES[name][0] in sections:
            put(FLAT_ALIASES[name], value, name)
        elif name in sections:
            put_section(name, value)
        elif name == "mixers" and isinstance(value, dict):  # dataclasses.asdict(config) nests them here
            for sub, sub_value in value.items():
                put_section(sub, sub_value) if sub in sections else unknown.append(f"mixers.{sub}")
        elif section in sections and f in options_fields(sections[section]):
            put((section, f), value, name)
        else:
            unknown.append(name)
    return out, spelled, unknown


def spellings(section: str, fields: tuple[str, ...], spelled: dict, dotted: bool) -> dict[str, str]:
    """How to name each field of a section in an error: as the user spelled it; else dotted when the user
    wrote dotted names, else its old flat name where it has one."""
    out = {}
    for f in fields:
        key = (section, f)
        if key in spelled:
            out[f] = spelled[key]
        elif not dotted and key in FLAT_NAMES:
            out[f] = FLAT_NAMES[key]
        else:
            out[f] = f"{section}.{f}"
    return out


def respell(error: ValueError, names: dict[str, str]) -> ValueError:
    """`error` with every field name (a whole word, not inside quotes) replaced by its spelling in `names`."""
    names = {plain: spelled for plain, spelled in names.items() if plain != spelled}
    if not names:
        return error
    pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    text = re.sub(rf"(?<![\w.'\"])({pattern})(?![\w'\"])", lambda m: names[m.group(1)], str(error))
    return ValueError(text)
