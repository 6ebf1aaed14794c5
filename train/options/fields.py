"""An option declared once: its check, its flag and its help, as the metadata of a config dataclass field.

    lr: float = option(2e-3, "optimizer", help="peak learning rate", check=real(low=0.0, low_open=True),
                       type=float)

The config checks the value where it enters (``RunConfig``: one line, ``name: expected …, got …``); the command
line's flag (``hybrid.train.cli.lm.flags``) is ``--lr``, read with ``type``, shown with ``help`` and the default of the
run kind it belongs to. A run kind that takes the option with another default, or a narrower meaning, says so with
``redeclare`` (its one line), never by declaring the option again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Option", "option", "redeclare", "option_of", "SECTIONS"]

# the sections every run kind draws its options from, in --help's order
SECTIONS = ("model", "data", "optimizer", "loop", "logging", "execution")


@dataclass(frozen=True)
class Option:
    section: str  # one of SECTIONS, or a run kind's own ("distillation", "task")
    help: str
    check: Callable[[str, Any], Any] | None = None  # (name, value) -> the value as kept; a ValueError names it
    type: Callable[[str], Any] | None = None  # reads the flag's text (argparse ``type``); None: the text itself
    metavar: str | tuple | None = None
    choices: tuple | None = None
    nargs: int | str | None = None
    action: str | None = None  # "store_true" (a bool), "append" (a list)
    flag: bool = True  # False: no flag of its own (``model``: --set and the model flags)
    shown_default: str | None = None  # the default as --help shows it, when the value itself does not say it


def option(default: Any, section: str, *, help: str, **declaration) -> dataclasses.Field:
    """A dataclass field holding its ``Option`` (``default`` a list or dict: a fresh copy per instance)."""
    meta = {"option": Option(section=section, help=help, **declaration)}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def option_of(cls, name: str) -> tuple[Any, Option]:
    """(default, Option) of field ``name`` of the config dataclass ``cls``."""
    f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if f is None or "option" not in f.metadata:
        raise KeyError(f"{cls.__name__} has no option {name!r}")
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return default, f.metadata["option"]


def redeclare(cls, name: str, default: Any = dataclasses.MISSING, **changes) -> dataclasses.Field:
    """Option ``name`` of the section (or config) ``cls``, for a run kind that takes it with another ``default``
    or a narrower meaning (``changes``: the Option's fields that differ, e.g. ``check``, ``type``, ``help``)."""
    base_default, declared = option_of(cls, name)
    default = base_default if default is dataclasses.MISSING else default
    declared = dataclasses.replace(declared, **changes)
    return option(default, declared.section, **{f.name: getattr(declared, f.name)
                                                 for f in dataclasses.fields(Option) if f.name != "section"})
