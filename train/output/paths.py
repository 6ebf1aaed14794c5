"""The output-path rule, one check for every command (``check_apart``): no output path equals, holds or lies inside
any input path (a run read, a teacher, a model folder, data, a tokenizer, a config file, an include path), with or
without ``--overwrite``; paths are compared with symlinks resolved. A command may then never replace, clear or write
into what it reads (``hybrid-export runs/R runs/R/checkpoint --overwrite`` would have replaced the run's
checkpoint). A resumed run writes into its own directory: that directory is its output, not an input.

Beside it, what every writer of a directory checks first: that the directory is not a file (``check_not_a_file``),
and the name of the one-writer lock file (``LOCK_FILE``, ``hybrid.train.output.run_lock``), which no check counts as
a directory's content.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

__all__ = ["check_apart", "data_input", "check_not_a_file", "LOCK_FILE"]

LOCK_FILE = ".hybrid.lock"  # the run-directory lock (hybrid.train.output.run_lock); never counted as content


def _resolved(path) -> Path:
    return Path(os.path.expanduser(os.fspath(path))).resolve()


def _named(inputs) -> list[tuple[str, Path]]:
    """``inputs`` as (how the message names it, path): a bare path is named "the input"."""
    out = []
    for item in inputs:
        name, path = item if isinstance(item, tuple) else ("the input", item)
        if path is not None and str(path) != "":
            out.append((name, Path(path)))
    return out


def check_apart(what: str, path, inputs) -> None:
    """The output-path rule: a ValueError if the output ``path`` equals an input, holds one, or lies inside one.
    ``inputs``: paths, or ``(name, path)`` pairs (``("--data", "texts")``); None entries are skipped. Symlinks are
    resolved on both sides, so a link to the input is the input."""
    out = _resolved(path)
    for name, source in _named(inputs):
        src = _resolved(source)
        if src == out:
            relation = "is"
        elif out in src.parents:
            relation = "holds"
        elif src in out.parents:
            relation = "lies inside"
        else:
            continue
        label = name if name == "the input" else f"the input {name}"
        raise ValueError(f"{what}: expected a path apart from {label} {source} (no output may be, hold or lie "
                         f"inside what a command reads, with or without --overwrite), got {path}, which {relation} "
                         f"it")


def data_input(data):
    """The path a ``--data`` value reads, for ``check_apart``: the standard library's folder for None / "stdlib",
    the path when it exists, None for a hub dataset name."""
    if data is None or str(data) == "stdlib":
        return sysconfig.get_paths()["stdlib"]
    path = Path(os.path.expanduser(os.fspath(data)))
    return path if path.exists() or path.is_symlink() else None


def check_not_a_file(what: str, path) -> None:
    """A ValueError when ``path`` (a directory to write) is a file, or lies under one."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            where = "" if p == path else f" ({path} would lie inside it)"
            raise ValueError(f"{what}: expected a directory, got the file {p}{where}")
        if p.is_dir():
            return
