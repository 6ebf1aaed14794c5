"""Progress: a tqdm bar on a terminal, plain lines in a log file.

    bar = progress_bar(total=500, desc="parity", unit="step")
    bar.update(1); bar.set_postfix(loss="0.6931"); bar.close()

tqdm redraws its bar with carriage returns, which a log file keeps as one endless line. When stderr is not a
terminal (a job's log, ``2> file``, a pipe), ``progress_bar`` gives a ``PlainProgress`` instead, the same calls,
which writes one line per tenth of the total (and at the end): ``parity: 150/500 steps (30%), 0m41s, loss=0.69``.
``hybrid-train`` does the same with its own lines (``Trainer(progress=None)``).
"""
from __future__ import annotations

import sys
import time

__all__ = ["progress_bar", "PlainProgress"]


class PlainProgress:
    """The part of tqdm's interface our commands use, as plain lines on stderr (see the module)."""

    def __init__(self, total: int | None = None, initial: int = 0, desc: str = "", unit: str = "it",
                 disable: bool = False, file=None, **_ignored):
        self.total, self.n, self.desc, self.unit, self.disable = total, initial, desc, unit, disable
        self.file = file if file is not None else sys.stderr
        self.postfix, self.start = "", time.monotonic()
        self.shown = self._tenth()

    def _tenth(self) -> int:
        return self.n * 10 // self.total if self.total else 0

    def _line(self) -> str:
        seconds = int(time.monotonic() - self.start)
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.n // self.total}%)" if self.total else ""
        tail = f", {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {self.n}{of} {self.unit}s{pct}, {seconds // 60}m{seconds % 60:02d}s{tail}"

    def write(self, msg: str) -> None:
        print(msg, file=self.file, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.disable and self.total and self._tenth() > self.shown:
            self.shown = self._tenth()
            self.write(self._line())

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if not self.disable and self.total and self.shown < 10 and self.n > 0:
            self.shown = 10
            self.write(self._line())
        self.disable = True


def progress_bar(*, total: int | None = None, initial: int = 0, desc: str = "", unit: str = "it",
                 disable: bool = False, **kwargs):
    """tqdm when stderr is a terminal, else ``PlainProgress`` (same arguments)."""
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, **kwargs)
    return PlainProgress(total=total, initial=initial, desc=desc, unit=unit, disable=disable)
