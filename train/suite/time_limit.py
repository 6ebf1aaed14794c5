"""Stop a suite between runs before a time limit (``hybrid-bench --max-minutes``): a run starts only while the time
left holds the longest run this command has finished, so a command ends inside a machine's limit (a GPU lent for
10 minutes a command) with every finished run's record written, and the same command continues the suite.

    limit = TimeLimit(8 * 60)                    # counted from now: the command's data preparation included
    run_suite(out, specs, execute, suite="baselines", time_limit=limit)
    if limit.left_runs: print(f"{limit.left_runs} runs left: run the same command again")

The first run of a command always starts (nothing has been timed yet) unless the time is already spent.
"""
from __future__ import annotations

import time
from typing import Callable

__all__ = ["TimeLimit"]


class TimeLimit:
    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic):
        if not seconds > 0:
            raise ValueError(f"seconds: expected a positive time limit, got {seconds}")
        self.seconds, self.clock, self.start = float(seconds), clock, clock()
        self.longest = 0.0  # the longest run finished under this limit, in seconds
        self.left_runs = 0  # runs not started because they would not fit
        self._began = self.start

    @property
    def left(self) -> float:
        """Seconds left (negative once spent)."""
        return self.seconds - (self.clock() - self.start)

    def fits(self) -> bool:
        """Whether another run, as long as the longest so far, ends inside the limit."""
        return self.left > 0 and self.left >= self.longest

    def begin(self) -> None:
        """A run starts."""
        self._began = self.clock()

    def end(self) -> None:
        """The run started last has finished: its time counts towards the longest."""
        self.longest = max(self.longest, self.clock() - self._began)

    def describe(self) -> str:
        """``"3 runs left after 8 minutes (the longest run took 130 s, 95 s were left)"``."""
        return (f"{self.left_runs} run{'s' if self.left_runs != 1 else ''} left after {self.seconds / 60:g} minutes "
                f"(the longest run took {self.longest:.0f} s, {max(self.left, 0):.0f} s were left)")
