"""Output directories written whole or not at all, and never over a user's files without ``--overwrite``.

    with staged_output_dir("runs/llama", overwrite=args.overwrite) as stage:
        ...write every file into stage...          # then stage becomes runs/llama in one rename

The rules every command that writes a directory follows (``hybrid-import``, ``hybrid-export``; ``hybrid-train``
keeps its own, for a run directory it resumes into):

- a target that exists and is not empty is refused unless ``overwrite`` (``--overwrite``); a target that is a
  file is refused always;
- everything is written into a fresh sibling directory ``.NAME.tmp-XXXX``; only when the command succeeds is
  that renamed to the target (an old target is first renamed aside, then removed), so the target holds either
  the old files or the new ones, never a mix;
- a command that fails leaves nothing behind: the staging directory is removed, and so are the parent
  directories it had to create.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["check_output_dir", "staged_output_dir"]


def check_output_dir(path, *, overwrite: bool, what: str = "out_dir", flag: str = "--overwrite",
                     inputs=()) -> Path:
    """``path`` as a Path, or a ValueError if it is a file, or a non-empty directory without ``overwrite``, or
    the working directory, or it is (or holds) one of ``inputs`` (what the command reads)."""
    path = Path(path)
    resolved = path.resolve()
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents or not path.name:
        raise ValueError(f"{what}: expected a directory to create or replace, got {str(path)!r}, the working "
                         f"directory or one above it")
    for source in inputs:
        source = Path(source).resolve()
        if source == resolved or resolved in source.parents:
            raise ValueError(f"{what}: expected a directory apart from the input {source}, got {path}, which "
                             f"{'is' if source == resolved else 'holds'} it")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what}: expected a directory, got the file {path}")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(f"{what}: expected a new or empty directory, got {path}, which is not empty; pass {flag} to "
                         f"replace it whole, or choose another directory")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def staged_output_dir(path, *, overwrite: bool, what: str = "out_dir", flag: str = "--overwrite", inputs=()):
    """Yield an empty staging directory beside ``path``; on success it replaces ``path`` (see the module)."""
    path = check_output_dir(path, overwrite=overwrite, what=what, flag=flag, inputs=inputs)
    parent = path.absolute().parent
    created = []  # parents this call creates, deepest last
    for p in reversed([parent, *parent.parents]):
        if not p.exists():
            created.append(p)
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=parent))
    holder = None  # where the old target waits while the new one is renamed into place
    try:
        os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes it 0700; the target gets the usual mode
        yield stage
        if path.exists():
            holder = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=parent))
            os.rename(path, holder / "old")
        os.rename(stage, path)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if holder is not None and (holder / "old").exists() and not path.exists():
            os.rename(holder / "old", path)  # the old target back where it was
        if holder is not None:
            shutil.rmtree(holder, ignore_errors=True)
        for p in reversed(created):
            try:
                p.rmdir()  # only if still empty
            except OSError:
                break
        raise
    if holder is not None:
        shutil.rmtree(holder, ignore_errors=True)


SUITE_MARK = ".hybrid-suite"  # written into a suite directory when the suite starts, so a rerun knows it


def prepare_suite_dir(path, *, overwrite: bool, what: str = "--out", marker: str = "results.jsonl") -> Path:
    """The directory of a resumable suite (``hybrid-bench``, ``hybrid-synthetic --suite``), created: a new or
    empty one, or one this suite started (its ``marker`` records, or the mark left when it started: the same
    command continues it). A file, or another non-empty directory, is refused; ``overwrite`` removes the
    directory first, so the suite starts over."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what}: expected a directory, got the file {path}")
    if overwrite:
        check_output_dir(path, overwrite=True, what=what)  # never the working directory itself
        shutil.rmtree(path, ignore_errors=True)
    elif (path.is_dir() and any(path.iterdir()) and not (path / marker).is_file()
          and not (path / SUITE_MARK).is_file()):
        raise ValueError(f"{what}: expected a new directory or one this suite started, got {path}, which is not "
                         f"empty and holds no suite ({marker}); pass --overwrite to replace it, or choose another "
                         f"directory")
    path.mkdir(parents=True, exist_ok=True)
    (path / SUITE_MARK).touch()
    return path
