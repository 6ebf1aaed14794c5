"""One writer per run directory: an exclusive ``fcntl.flock`` on ``DIR/.hybrid.lock`` for the writer's life.

    with lock_run_dir("runs/mine", command="hybrid-train", what="--out"):
        ...write the run...

Every command that writes a run or suite directory in place takes it before it clears or writes anything
(``hybrid-train`` fresh and ``--resume``, ``hybrid-distill``, ``hybrid-synthetic`` runs and suites, each suite
directory of ``hybrid-bench``). A second writer is refused at once, in one line naming the holder's process id
and command (``RunDirBusy``, a ValueError). The kernel drops the lock when its holder exits however it ends
(SIGKILL included), so a stale lock file never blocks anyone: the next writer simply takes it.

The lock file holds the holder's ``pid command`` (for the message); it is removed when the lock is released,
together with the directories that taking the lock created, if nothing else was written into them (a command
that failed before writing leaves no folder behind). Because the file can be removed, a writer that got the lock
checks that the path still names the file it locked, and tries again if not. Under torchrun rank 0 takes the lock
and the ranks agree (``hold_run_dir``): every rank fails together, naming the holder.
"""
from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from pathlib import Path

from .paths import LOCK_FILE, check_apart, check_not_a_file

__all__ = ["RunDirLock", "RunDirBusy", "lock_run_dir", "hold_run_dir", "LOCK_FILE"]


class RunDirBusy(ValueError):
    """Another process holds the directory's lock."""


def _holder(lock_path: Path) -> str:
    """"pid 123, hybrid-train" from the lock file (the holder writes it right after locking: a short wait)."""
    for _ in range(20):
        try:
            text = lock_path.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        if text:
            pid, _, command = text.partition(" ")
            return f"pid {pid}" + (f", {command}" if command else "")
        time.sleep(0.01)
    return "pid unknown"


class RunDirLock:
    """The lock of one directory; ``acquire()`` / ``release()``, or a context manager."""

    def __init__(self, path, *, command: str | None = None, what: str = "--out"):
        command = command or os.path.basename(sys.argv[0]) or "python"  # the console script's name
        self.path, self.command, self.what = Path(path), command, what
        self.lock_path = self.path / LOCK_FILE
        self._fd: int | None = None
        self._created: list[Path] = []  # the directories acquire() made, deepest last

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunDirLock":
        check_not_a_file(self.what, self.path)
        absolute = self.path.absolute()
        self._created = [p for p in reversed([absolute, *absolute.parents]) if not p.exists()]
        try:
            fd = self._create_and_lock()
        except BaseException:
            self._remove_created()  # a refused or failed writer leaves no folder behind
            raise
        self._fd = fd
        return self

    def _create_and_lock(self) -> int:
        """The directory made, its lock taken and the holder written; a one-line ValueError naming ``what`` when
        the system refuses (``/proc/x``, a read-only disk, no permission)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = self._lock()
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {self.command}\n".encode())
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            raise ValueError(f"{self.what}: expected a directory this process can create and write, got "
                             f"{self.path} ({where}{e.strerror or e})") from None
        return fd

    def _lock(self) -> int:
        """The locked file's descriptor; RunDirBusy naming the holder when another process has it."""
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise RunDirBusy(
                    f"{self.what}: expected a directory no other process is writing, got {self.path}, which "
                    f"{_holder(self.lock_path)} is writing (its lock {self.lock_path}); wait for it to end, or "
                    f"choose another directory") from None
            try:  # the holder before us may have removed the file between our open and our lock: start again
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_path))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if os.path.samestat(os.fstat(self._fd), os.stat(self.lock_path)):
                os.unlink(self.lock_path)  # while still locked: no one can have taken this file meanwhile
        except OSError:
            pass  # moved or removed with its directory (a staged output renamed into place)
        os.close(self._fd)
        self._fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for p in reversed(self._created):
            try:
                p.rmdir()  # only if nothing was written into it
            except OSError:
                break
        self._created = []

    def __enter__(self) -> "RunDirLock":
        return self.acquire() if not self.held else self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run_dir(path, *, command: str, what: str = "--out", inputs=()) -> RunDirLock:
    """Take the lock of ``path`` (created with its parents, after the output-path rule against ``inputs``,
    ``hybrid.train.output.paths.check_apart``); returns the held lock. ``RunDirBusy`` when another process
    holds it."""
    check_apart(what, path, inputs)
    return RunDirLock(path, command=command, what=what).acquire()


def hold_run_dir(path, *, command: str, env=None, device=None, what: str = "--out", inputs=()) -> RunDirLock | None:
    """``lock_run_dir`` on rank 0 of a torchrun job (``env``: a ``DistEnv``), every rank raising when it failed;
    the lock on rank 0, None on the others."""
    if env is None or not env.distributed:
        return lock_run_dir(path, command=command, what=what, inputs=inputs)
    import torch

    lock, error = None, None
    if env.is_main:
        try:
            lock = lock_run_dir(path, command=command, what=what, inputs=inputs)
        except Exception as e:  # noqa: BLE001 - raised below, after the ranks have agreed
            error = e
    failed = env.all_reduce(torch.tensor([0.0 if error is None else 1.0], device=device))
    if error is not None:
        raise error
    if failed.item():
        raise RunDirBusy(f"{what}: expected a directory rank 0 can lock, got {path}, which another process is "
                         f"writing (rank 0 names it)")
    return lock
