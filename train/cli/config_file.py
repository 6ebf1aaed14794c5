"""Config files for ``hybrid-train --config FILE``: TOML or JSON, the ``TrainConfig`` fields as keys.

    load_config_file("run.toml")      # {"preset": "hybrid", "steps": 2000, "model": {"window": 64}, ...}

The keys are ``TrainConfig``'s fields, as in the ``train_config.json`` every run writes (so that file is a valid
config file: it gives the same run config back), with the HybridConfig overrides under ``model`` (a
``[model]`` table in TOML). A key that is not a field is refused, naming it; a file may leave out any key (its
default applies). Flags given on the command line override the file, a ``--set`` / ``--window`` one model key
at a time. TOML has no null, so the command line's spellings are accepted: ``eval_batches = "all"`` and, under
``[model]``, ``window = "none"``; JSON may use them too, or ``null``. Reading TOML needs Python 3.11 (``tomllib``)
or the ``tomli`` package on 3.10.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from ..lm.config import TrainConfig

__all__ = ["load_config_file", "CONFIG_SUFFIXES"]

CONFIG_SUFFIXES = (".toml", ".json")
# the command line's words for None, accepted in files (TOML has no null)
_NONE_WORDS = {("eval_batches",): "all", ("model", "window"): "none"}


def _toml_loads(text: str, path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ValueError(f"config: reading TOML needs Python 3.11 or the tomli package (pip install tomli), "
                             f"got {path} on an older Python; or write the config as .json") from None
    return tomllib.loads(text)


def load_config_file(path) -> dict:
    """The ``TrainConfig`` keyword arguments a TOML or JSON file gives (see the module); a ValueError names the
    file and the problem (unreadable, not a table, an unknown key, a model override that is not a field)."""
    from hybrid.models import HybridConfig

    path = Path(path).expanduser()
    if path.suffix.lower() not in CONFIG_SUFFIXES:
        raise ValueError(f"config: expected a .toml or .json file, got {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"config: expected an existing file, got {path} (not found)") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"config: expected a UTF-8 text file, got {path} ({e})") from None
    try:
        d = _toml_loads(text, path) if path.suffix.lower() == ".toml" else json.loads(text)
    except ValueError as e:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        if str(e).startswith("config:"):
            raise
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise ValueError(f"config: expected valid {kind}, got {path} ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"config: expected a table of TrainConfig fields, got {type(d).__name__} in {path}")
    known = [f.name for f in fields(TrainConfig)]
    for key in d:
        if key not in known:
            raise ValueError(f"config: expected TrainConfig's fields as keys, got unknown key {key!r} in {path} "
                             f"(the fields: {', '.join(known)})")
    if "model" in d:
        if not isinstance(d["model"], dict):
            raise ValueError(f"config: expected 'model' to be a table of HybridConfig fields, got "
                             f"{type(d['model']).__name__} in {path}")
        model_fields = HybridConfig.field_names() + HybridConfig.section_names()  # a section may be a table
        for key in d["model"]:
            if key not in model_fields:
                raise ValueError(f"config: expected HybridConfig fields under 'model', got unknown key "
                                 f"'model.{key}' in {path} (the fields: {', '.join(model_fields)})")
        d["model"] = dict(d["model"])
    for where, word in _NONE_WORDS.items():
        holder = d
        for part in where[:-1]:
            holder = holder.get(part) if isinstance(holder.get(part), dict) else {}
        if isinstance(holder.get(where[-1]), str) and holder[where[-1]].lower() == word:
            holder[where[-1]] = None
    return d
