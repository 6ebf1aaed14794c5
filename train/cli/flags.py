"""Flags generated from the run configs' options (``hybrid.train.options``): each option's declaration gives its
flag, how the flag's text is read, its metavar and choices, and its help; the run kind's field gives the default.

    groups = add_config_flags(parser, TrainConfig)          # --preset … --fsdp, one --help group per section
    add_option_flags(group, TaskRunConfig, ["steps", "lr"], default=None, default_text="the budget's")

A flag is read by the rule its check states (``Whole(1)``: a positive integer; ``Whole(0)``: an integer >= 0; with
``none_word``, that word for None; ``Real(strict=True)``: a finite number in its range; ``OneOf``: its choices), so a
value a config would refuse is refused as the command line is parsed, in one line naming the flag. The flags that
are not config fields are declared here too, once: the model flags (HybridConfig fields: ``--pattern``,
``--d-model``, ``--n-layers``, ``--n-heads``, ``--window``) and ``--set``.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..options import checks
from ..options.fields import SECTIONS, Option, option_of
from ..options.sections import ExecutionOptions, LoggingOptions
from .parts import add_set_flag, count, device_name, finite_float, int_at_least, int_or, positive_int

__all__ = ["add_config_flags", "add_option_flags", "add_model_flags", "add_run_flags", "add_device_flag", "add_log_flag",
           "add_threads_flag", "MODEL_FLAGS", "NOT_CONFIG", "flag_of", "value_type", "config_from_args",
           "absolute_inputs", "PATH_INPUTS"]

# HybridConfig fields with a flag of their own (everything else: --set); their help, with its default
MODEL_FLAGS = {
    "pattern": (None, "mixer letters repeated over the layers: R recurrence, A attention, M retention, G VO-RoPE "
                      "gated linear attention (e.g. RRA) (default: the preset's)"),
    "d_model": (positive_int, "model width (default: the preset's at --size)"),
    "n_layers": (positive_int, "number of blocks (default: the preset's at --size)"),
    "n_heads": (positive_int, "heads per mixer (default: the preset's at --size)"),
    "window": (int_or("none"), "attention sliding window in tokens, or 'none' for global attention (default: the "
                               "preset's in hybrid-train, the teacher's in hybrid-distill)"),
}
# flags of a command that are no config field: how the command runs, not what the run is
NOT_CONFIG = ("resume", "overwrite", "quiet", "config", "threads")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def value_type(declared: Option):
    """How the flag's text becomes a value: the declared converter, or the rule of the option's check."""
    check = declared.check
    if isinstance(check, checks.Whole):
        if check.none_word is not None:
            return int_or(check.none_word)
        return {1: positive_int, 0: count}.get(check.low) or int_at_least(check.low, f"an integer >= {check.low}")
    if isinstance(check, checks.Real) and check.strict:
        return finite_float(check.low, low_open=check.low_open, high=check.high)
    if check is checks.check_device:
        return device_name
    return declared.type


def _shown(default, declared: Option) -> str:
    """The default as --help shows it: the declaration's words, else the value (off / on, none for nothing)."""
    if declared.shown_default is not None:
        return declared.shown_default
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None or default == [] or default == {}:
        return "none"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def add_option_flags(group, config_cls, names, *, default=argparse.SUPPRESS, default_text: str | None = None,
                     help: dict | None = None) -> None:
    """A flag for each option ``names`` of ``config_cls`` in ``group``. ``default``: what argparse holds when the
    flag is not given (SUPPRESS: nothing, so the config's default, or a resumed run's saved value, stays);
    ``default_text``: the default --help names instead of the config's; ``help``: {name: text added to the help}."""
    for name in names:
        value, declared = option_of(config_cls, name)
        shown = default_text if default_text is not None else _shown(value, declared)
        text = declared.help + (f"; {help[name]}" if help and name in help else "")
        kwargs = dict(dest=name, default=default, help=text + (f" (default: {shown})" if shown else ""))
        if declared.action == "store_true":
            kwargs["action"] = "store_true"
        elif declared.action == "append":
            kwargs.update(action="append", choices=list(declared.choices) if declared.choices else None)
            if default is not argparse.SUPPRESS:
                kwargs["default"] = list(default or [])
        else:
            kwargs.update(type=value_type(declared), metavar=declared.metavar, nargs=declared.nargs,
                          choices=list(declared.choices) if declared.choices else None)
        group.add_argument(flag_of(name), **{k: v for k, v in kwargs.items() if v is not None or k == "default"})


def add_config_flags(parser, config_cls, *, skip=(), titles: dict | None = None) -> dict:
    """A flag for every option of ``config_cls`` that has one (but ``skip``), in one --help group per section
    (``titles``: a section's title where it is not its name); returns {section: group}."""
    by_section: dict[str, list[str]] = {}
    for f in dataclasses.fields(config_cls):
        declared = f.metadata.get("option")
        if declared is not None and declared.flag and f.name not in skip:
            by_section.setdefault(declared.section, []).append(f.name)
    order = [s for s in SECTIONS if s in by_section] + [s for s in by_section if s not in SECTIONS]
    groups = {}
    for section in order:
        groups[section] = parser.add_argument_group((titles or {}).get(section, section))
        add_option_flags(groups[section], config_cls, by_section[section])
    return groups


def add_model_flags(group, names=tuple(MODEL_FLAGS), *, default=argparse.SUPPRESS, set_help: str) -> None:
    """The model flags ``names`` (HybridConfig fields) and ``--set KEY=VALUE`` for any other, into ``group``."""
    for name in names:
        kind, text = MODEL_FLAGS[name]
        group.add_argument(flag_of(name), default=default, help=text, **({"type": kind} if kind else {}))
    add_set_flag(group, default=default, help=set_help + " (default: none)")


def add_run_flags(group, *, resume: str, overwrite: str) -> None:
    """``--resume DIR`` (what a resumed run may change: ``resume``), ``--overwrite`` (``overwrite``: what it replaces)
    and ``--quiet``: the flags of a command that trains a run, beside its config's."""
    group.add_argument("--resume", metavar="DIR", help=resume + " (default: none, a new run)")
    group.add_argument("--overwrite", action="store_true", help=overwrite + " (default: off)")
    group.add_argument("--quiet", action="store_true", help="print nothing but errors (default: off)")


def add_device_flag(group, *, default="auto") -> None:
    """``--device`` (``ExecutionOptions.device``) for a command that is not a run config's: checked as it is parsed."""
    add_option_flags(group, ExecutionOptions, ["device"], default=default)


def add_threads_flag(group, *, default=None) -> None:
    """``--threads N``: torch's CPU threads for this command (``hybrid.train.cli.parts.run_command`` sets them
    before the command runs and puts them back after); no run config's field: how a command runs, not what it
    computes."""
    group.add_argument("--threads", type=positive_int, default=default,
                       help="torch CPU threads (default: torch's choice, one per core; 1 is fastest on a machine "
                            "shared with other work)")


def add_log_flag(group, *, default=(), what: str | None = None) -> None:
    """``--log tensorboard|wandb`` (``LoggingOptions.log``, repeatable) into ``args.log``; ``what``: what the command
    sends, where it is not every metrics record as it is written."""
    add_option_flags(group, LoggingOptions, ["log"], default=default, help={"log": what} if what else None)


def config_from_args(args: argparse.Namespace, model_flags=tuple(MODEL_FLAGS)) -> dict:
    """The config fields the command line sets (only those given), the model flags and ``--set`` pairs merged into
    one ``model`` dict of overrides."""
    given = dict(vars(args))
    for name in NOT_CONFIG:
        given.pop(name, None)
    model = {name: given.pop(name) for name in model_flags if name in given}
    for key, value in given.pop("sets", []):
        model[key] = value
    if model:
        given["model"] = model
    if "betas" in given:
        given["betas"] = tuple(given["betas"])
    return given


# inputs a run names by path: recorded absolute, so a resume from another directory reads the same files
PATH_INPUTS = ("data", "tokenizer", "init_from", "teacher")


def absolute_inputs(given: dict) -> dict:
    """``given`` with each of ``PATH_INPUTS`` that names an existing local path made absolute (a relative one would
    be read against the directory of a later resume, or taken there for a hub dataset's name); "stdlib" and hub
    names stay as they are."""
    def absolute(value):
        if not isinstance(value, str) or value == "stdlib" or not Path(value).expanduser().exists():
            return value
        return str(Path(value).expanduser().resolve())
    return {name: absolute(value) if name in PATH_INPUTS else value for name, value in given.items()}
