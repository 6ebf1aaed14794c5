"""The tests part's plugin for its ``pytest`` child (``-p``):

- the Triton kernels the child loads from the cache or compiles are counted into the file named by
  ``$HYBRID_TRITON_LISTEN``, as the check's own parts count theirs (``triton_compiles``);
- each failure's traceback is printed as soon as the test fails, not in pytest's summary at the end: a suite
  stopped at the part's limit has no summary (on 2026-11-28, five failures on an H200 came back as names only);
- each test's seconds (setup, call and teardown together) follow it on a line of their own, for the same reason:
  ``--durations`` prints them in the summary, and a stopped suite's log said what finished but not what the
  part's seconds went to (on 2026-11-28, 256 s, of which 80 s were Triton's compiles);
- fla-core's autotuners are held to one config each (``one_config``): the tests check numbers, and fla's tuning
  over up to 48 configs per kernel and key took the rest of that part's limit.

(The order the CUDA tests run in is tests/cuda/conftest.py's.)"""
from __future__ import annotations

import os

import pytest

from .one_config import hold_to_one_config
from .triton_compiles import listen

LISTEN_VARIABLE = "HYBRID_TRITON_LISTEN"
TRACEBACK_LINES = 60  # the end of each traceback: where it failed and why

if os.environ.get(LISTEN_VARIABLE):
    listen(os.environ[LISTEN_VARIABLE])

_config = None
_seconds: dict[str, float] = {}  # test id -> its seconds so far (setup, call)
_held = 0  # fla autotuners held to one config


def pytest_configure(config):
    global _config, _held
    _config = config
    _held = hold_to_one_config()


def pytest_report_header(config):
    return f"fla-core autotuners held to one config each (the tests check numbers, not speed): {_held}"


@pytest.hookimpl(trylast=True)  # after the verbose line's "FAILED", not inside it
def pytest_runtest_logreport(report):
    terminal = _config and _config.pluginmanager.get_plugin("terminalreporter")  # registered after configure
    if not terminal:
        return
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    if report.failed:
        _print_traceback(terminal, report)
    if report.when == "teardown":
        terminal.write_line(f"    {_seconds.pop(report.nodeid):.1f} s")


def _print_traceback(terminal, report) -> None:
    lines = report.longreprtext.splitlines()
    cut = len(lines) - TRACEBACK_LINES
    terminal.write_line("")
    terminal.write_line(f"---- {report.nodeid} failed ({report.when}) ----")
    if cut > 0:
        terminal.write_line(f"({cut} lines of the traceback left out)")
    for line in lines[max(cut, 0):]:
        terminal.write_line(line)
    terminal.write_line(f"---- end of {report.nodeid} ----")
