"""The parts every console script is built from: the parser, the value types, shared flags and the guard.

    def main(argv=None) -> int:
        return run_command(my_parser(), argv, lambda args: do_it(args))   # the exit status

The rules they keep (docs/design.md, "The commands' shared rules"):

- a user error (a bad value, a missing path, a corrupt checkpoint, an offline hub name) is one line on stderr,
  ``<prog>: error: …``, and exit status 2; a diverged run (FloatingPointError) exits 1, an interrupted one
  (Ctrl-C, or SIGTERM: ``sigterm_interrupts``) 130;
- no flag is read as an abbreviation of another (``--log`` never becomes ``--log-every``);
- ``HYBRID_TRACEBACK=1`` (or true / yes / on) shows the full traceback instead of the one line.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import sys
import threading

from hybrid.models import HybridConfig

from ..data import HubOfflineError
from ..parallel.device import DEVICE_NAMES, check_device, env_int

__all__ = [
    "Parser", "UsageError", "USER_ERRORS", "TRACEBACK_ENV", "show_tracebacks",
    "int_at_least", "positive_int", "count", "finite_float", "int_or", "device_name", "set_pair",
    "add_set_flag",
    "one_line_error", "guarded", "run_command", "sigterm_interrupts",
]

TRACEBACK_ENV = "HYBRID_TRACEBACK"
USER_ERRORS = (ValueError, OSError, HubOfflineError, ImportError)  # OSError: unwritable --out, a full disk, …


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) and exit 2, and that never expands an abbreviation
    (``--log`` would otherwise be read as ``--log-every``: a misspelt or future flag must not become another)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class UsageError(ValueError):
    """A command-line mistake found after parsing."""


# ---------------------------------------------------------------------------------------------- value types


def int_at_least(low: int, what: str):
    """An argparse type: an int >= ``low``; the error says ``expected {what}, got '…'``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v

    return parse


positive_int = int_at_least(1, "a positive integer")
count = int_at_least(0, "an integer >= 0")


def finite_float(low: float, *, low_open: bool = False, high: float | None = None):
    """An argparse type: a finite float in [low, high] (or (low, high]); the message never offers inf, which is
    refused."""
    if high is None:
        what = f"a finite number {'>' if low_open else '>='} {low:g}"
    else:
        what = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        ok = math.isfinite(v) and (v > low if low_open else v >= low) and (high is None or v <= high)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v

    return parse


def int_or(word: str):
    """An argparse type: a positive int, or ``word`` (any case) for None, e.g. ``--window none``."""

    def parse(text: str):
        return None if text.lower() == word else positive_int(text)

    return parse


def device_name(text: str) -> str:
    """An argparse type: auto, cpu, cuda or cuda:N (``hybrid.train.parallel.device.check_device``)."""
    try:
        return check_device("--device", text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {DEVICE_NAMES}, got {text!r}") from None


def set_pair(text: str) -> tuple[str, object]:
    """``--set KEY=VALUE``: a HybridConfig field and its value, parsed as JSON (a bare word stays a string)."""
    key, sep, value = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key not in HybridConfig.field_names():  # stack fields, dotted mixer fields, and the old flat names
        raise argparse.ArgumentTypeError(
            f"unknown HybridConfig field {key!r}; known fields: {', '.join(HybridConfig.field_names())}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError as e:
        if value.lstrip()[:1] in ('{', '[', '"'):  # meant as JSON: say why it is not
            raise argparse.ArgumentTypeError(
                f"{key}: expected a JSON value, got {value!r} ({e.msg} at column {e.colno})") from None
        return key, value  # a bare string: --set rope_layout=half


# ---------------------------------------------------------------------------------------------- shared flags


def add_set_flag(group, *, help: str, default=()) -> None:
    """``--set KEY=VALUE`` (repeatable) into ``args.sets``: a list of ``(field, value)`` pairs."""
    default = list(default) if isinstance(default, (list, tuple)) else default  # argparse.SUPPRESS stays
    group.add_argument("--set", dest="sets", metavar="KEY=VALUE", type=set_pair, action="append", default=default,
                       help=help)


# ---------------------------------------------------------------------------------------------- the guard


def show_tracebacks() -> bool:
    """``HYBRID_TRACEBACK`` is 1, true, yes or on: let errors through with their traceback."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def one_line_error(prog: str, error: BaseException) -> int:
    """Print ``error`` as ``<prog>: error: [rank R] message`` (white space folded into one line); returns 2."""
    rank = os.environ.get("RANK")
    where = f"[rank {rank}] " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else ""
    if isinstance(error, OSError) and error.strerror and error.filename:  # "[Errno 13] …" -> "path: reason"
        error = f"{error.filename}: {error.strerror}"
    message = " ".join(str(error).split()) or type(error).__name__
    print(f"{prog}: error: {where}{message}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM (``kill``, a job scheduler's stop) raises KeyboardInterrupt in the main thread as Ctrl-C does, so the
    command ends the same way: its message, its run directory's lock released. Yields a list that gets "SIGTERM"
    when one came. Off the main thread (where no handler can be set) nothing changes."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def stop(signum, frame):
        received.append("SIGTERM")
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def guarded(prog: str, fn) -> int:
    """``fn()``'s exit status, its errors turned into one line: a user error 2, a FloatingPointError (a diverged
    run) 1, Ctrl-C or SIGTERM 130 (``KeyboardInterrupt("at step 7; …")`` says what survived). Everything passes
    through untouched when ``show_tracebacks()`` (SIGTERM as a KeyboardInterrupt)."""
    with sigterm_interrupts() as received:
        if show_tracebacks():
            return fn()
        try:
            return fn()
        except KeyboardInterrupt as e:
            said, by = str(e), " by SIGTERM" if received else ""
            print(f"{prog}: interrupted{by}" + (said if said[:1] in (";", ",", ":", "") else f" {said}"),
                  file=sys.stderr)
            return 130
        except FloatingPointError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 1
        except USER_ERRORS as e:
            return one_line_error(prog, e)


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None, run) -> int:
    """Parse ``argv`` (None: the command line), then ``run(args)`` under ``guarded``: the exit status. ``--help``
    gives 0, a bad option 2 (``Parser.error`` has printed its one line). ``--threads N`` (``cli.flags
    .add_threads_flag``) sets torch's CPU threads for this command only."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code
    threads = getattr(args, "threads", None)
    try:
        if threads is None:
            return guarded(parser.prog, lambda: run(args))
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return guarded(parser.prog, lambda: run(args))
        finally:
            torch.set_num_threads(before)
    finally:
        _collect_under_torchrun()


def _collect_under_torchrun() -> None:
    """An FSDP2-sharded model sits in reference cycles (its hooks and state point back at it), so it outlives the
    command until a garbage collection; left to interpreter shutdown, tearing down the gloo process group's
    objects there can abort the process (SIGABRT, "terminate called without an active exception";
    pytorch/pytorch#179291). Collect while Python is whole: only under torchrun (one process never shards, and
    a full collection costs a test calling a command ~0.4 s)."""
    if env_int("WORLD_SIZE", 1) > 1:
        gc.collect()
