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
  directories it had to create; a command killed outright leaves its staging directory, which the next writer of
  that target removes (and names an old target left aside between the two renames, which it keeps);
- the target's lock (``hybrid.train.output.run_lock``) is held while it is written: one writer at a time.

The output-path rule, one check for every command (``check_apart``, ``hybrid.train.output.paths``): no output
path equals, holds or lies inside any input path, with or without ``--overwrite``.

A run of ours (``foreign_entries``): a directory is one when every entry in it is a name that kind of run writes,
and its record file (``train_config.json`` for hybrid-train), when present, reads back as that run's config. A
directory that is not empty and not a run of ours is refused without ``--overwrite`` (hybrid-train).
"""
from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from .paths import LOCK_FILE, check_apart, check_not_a_file, data_input
from .run_lock import RunDirLock

__all__ = ["check_output_dir", "staged_output_dir", "check_apart", "data_input", "check_not_a_file",
           "foreign_entries", "clear_dir", "prepare_suite_dir", "LOCK_FILE"]

def foreign_entries(path, *, names, prefixes=(), record: str | None = None, reads_record=None) -> list[str]:
    """The entries of the directory ``path`` that a run of ours would not have written: names not in ``names``
    (or starting with one of ``prefixes``), and the ``record`` file when ``reads_record(its text)`` raises (it is
    someone else's file of that name). [] for a missing or empty directory, or a run of ours."""
    path = Path(path)
    if not path.is_dir():
        return []
    entries = sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)
    foreign = [n for n in entries if n not in names and not n.startswith(tuple(prefixes))]
    if record is not None and record in entries and reads_record is not None:
        try:
            reads_record((path / record).read_text(encoding="utf-8"))
        except Exception:  # noqa: BLE001 - any failure to read it back means it is not our record
            foreign.append(record)
    if entries and not foreign and record is not None and record not in entries and reads_record is not None:
        foreign = entries  # our file names, but no record of ours says who wrote them
    return foreign


def clear_dir(path) -> None:
    """Remove everything inside the directory ``path`` but the lock file (a writer holds it)."""
    for p in Path(path).iterdir():
        if p.name == LOCK_FILE:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def check_output_dir(path, *, overwrite: bool, what: str = "out_dir", flag: str = "--overwrite",
                     inputs=()) -> Path:
    """``path`` as a Path, or a ValueError if it is a file, or a non-empty directory without ``overwrite``, or
    the working directory, or it is, holds or lies inside one of ``inputs`` (what the command reads:
    ``check_apart``)."""
    path = Path(path)
    resolved = path.resolve()
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents or not path.name:
        raise ValueError(f"{what}: expected a directory to create or replace, got {str(path)!r}, the working "
                         f"directory or one above it")
    check_apart(what, path, inputs)
    check_not_a_file(what, path)
    if path.is_dir() and any(p.name != LOCK_FILE for p in path.iterdir()) and not overwrite:
        raise ValueError(f"{what}: expected a new or empty directory, got {path}, which is not empty; pass {flag} to "
                         f"replace it whole, or choose another directory")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def staged_output_dir(path, *, overwrite: bool, what: str = "out_dir", flag: str = "--overwrite", inputs=(),
                      command: str | None = None, locked: bool = False):
    """Yield an empty staging directory beside ``path``; on success it replaces ``path`` (see the module). The
    target's lock (``hybrid.train.output.run_lock``) is held throughout: a second writer of the same target is refused,
    naming this process (``command``: how; default the program's name). ``locked``: the caller holds it already
    (taken before a long computation, so a second writer is refused at once)."""
    path = check_output_dir(path, overwrite=overwrite, what=what, flag=flag, inputs=inputs)
    with nullcontext() if locked else RunDirLock(path, command=command, what=what):
        check_output_dir(path, overwrite=overwrite, what=what, flag=flag)  # again: a writer may have finished
        _clear_leftovers(path)
        with _staged(path) as stage:
            yield stage


def _clear_leftovers(path: Path) -> None:
    """What a writer of ``path`` that was killed (SIGKILL, out of memory, power) left beside it: its staging
    directories ``.NAME.tmp-*`` are removed (the caller holds the target's lock, so no live writer owns one); an
    old target it had set aside, between its two renames, in ``.NAME.old-*/old``, is named in a note and kept."""
    parent = path.absolute().parent
    for stale in sorted(parent.glob(f".{glob.escape(path.name)}.tmp-*")):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    for holder in sorted(parent.glob(f".{glob.escape(path.name)}.old-*")):
        if (holder / "old").is_dir():
            print(f"note: {holder / 'old'} holds the {path} that an interrupted replacement set aside; move it "
                  f"back or delete it", file=sys.stderr, flush=True)


@contextmanager
def _staged(path: Path):
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


def prepare_suite_dir(path, *, overwrite: bool, what: str = "--out", marker: str = "results.jsonl",
                      inputs=()) -> Path:
    """The directory of a resumable suite (``hybrid-bench``, ``hybrid-synthetic --suite``), created: a new or
    empty one, or one this suite started (its ``marker`` records, or the mark left when it started: the same
    command continues it). A file, a path apart from ``inputs`` (``check_apart``), or another non-empty directory,
    is refused; ``overwrite`` empties the directory first (the lock of its writer stays), so the suite starts
    over."""
    path = Path(path)
    check_apart(what, path, inputs)
    check_not_a_file(what, path)
    if overwrite:
        check_output_dir(path, overwrite=True, what=what)  # never the working directory itself
        if path.is_dir():
            clear_dir(path)
    elif (path.is_dir() and any(p.name != LOCK_FILE for p in path.iterdir()) and not (path / marker).is_file()
          and not (path / SUITE_MARK).is_file()):
        raise ValueError(f"{what}: expected a new directory or one this suite started, got {path}, which is not "
                         f"empty and holds no suite ({marker}); pass --overwrite to replace it, or choose another "
                         f"directory")
    path.mkdir(parents=True, exist_ok=True)
    (path / SUITE_MARK).touch()
    return path
