"""Model overrides (``TrainConfig.model``, ``DistillConfig.model``) merged and compared one model field at a time,
however each is spelled.

A field has three spellings (``config_names``): its old flat name (``window``), its dotted name
(``attention.window``) and a section table (``{"attention": {"window": 8}}``, TOML's ``[model.attention]``). A
``--config`` file may spell it one way and a flag another, and a resumed run's saved overrides one way and the resume
command another: ``merge_model`` lets the later layer override the field, ``same_model`` compares the fields.
"""
from __future__ import annotations

from .config import HybridConfig
from .config_names import FLAT_ALIASES

__all__ = ["model_key", "merge_model", "same_model"]


def model_key(name: str) -> str:
    """The one spelling of a model field: an old flat name's dotted name (``window`` → ``attention.window``), else
    the name itself."""
    section_field = FLAT_ALIASES.get(name)
    return name if section_field is None else ".".join(section_field)


def _by_field(model: dict) -> dict:
    """``model`` with each section table spread into dotted names, as given otherwise."""
    sections = HybridConfig.section_names()
    out = {}
    for name, value in model.items():
        if name in sections and isinstance(value, dict):
            out.update({f"{name}.{field}": v for field, v in value.items()})
        else:
            out[name] = value
    return out


def merge_model(*layers: dict) -> dict:
    """The overrides of ``layers``, each later one replacing a field the earlier ones set however either spells it;
    the field keeps the later spelling. Two spellings within one layer are both kept, for the model config to
    refuse ("window: also given as attention.window")."""
    merged: dict = {}
    for layer in layers:
        layer = _by_field(layer)
        replaced = {model_key(name) for name in layer}
        merged = {name: v for name, v in merged.items() if model_key(name) not in replaced}
        merged.update(layer)
    return merged


def same_model(a: dict, b: dict) -> bool:
    """Whether two override dicts set the same fields to the same values, whatever their spellings."""
    def keyed(model: dict) -> dict:
        return {model_key(name): value for name, value in _by_field(model).items()}

    return keyed(a) == keyed(b)
