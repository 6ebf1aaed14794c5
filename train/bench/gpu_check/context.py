"""What a part receives: the device, the sizes (full on a GPU, tiny in a dry run), its deadline, and
``record``, which appends one row to the part's log the moment it is measured (a killed part keeps its rows)."""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["CheckContext", "rel_error", "median_time", "measured_rows", "ROW_KEYS"]

# The fields that name a row of the parts that can skip what an earlier run measured (``--skip-measured``). A
# models row of a model that runs the Triton scan names its kernels (``scan``): rows measured under other kernels
# (before 2026-11-27's third session, the tile layout; their rows have no ``scan``) are measured again.
ROW_KEYS = {"models": ("model", "execution", "batch", "T", "B", "size", "scan"),
            "decoding": ("model", "size", "context", "batch", "step")}
# A field that rows written before it existed lack, and the value they had: decoding rows were all eager steps.
ROW_DEFAULTS = {"step": "eager"}


def _row_key(section: str, row: dict) -> str:
    return json.dumps([section, *(row.get(k, ROW_DEFAULTS.get(k)) for k in ROW_KEYS[section])])


def measured_rows(paths: str | Path, device: str | None = None) -> dict[str, str]:
    """The rows that earlier runs' ``results.json`` files (comma-separated paths) measured (no error, not skipped)
    in the sections of ``ROW_KEYS``, by key, each with its run's commit. With ``device``, a file measured on
    another device (its header's) counts for nothing: a ratio such as the hybrid's tokens/s over the
    Transformer's needs both rows from one device (the lent GPU is an H100 or an H200). One-line ``ValueError``
    for a file that is no such report."""
    found = {}
    for path in [p for p in str(paths).split(",") if p.strip()]:
        try:
            data = json.loads(Path(path.strip()).read_text())
            rows, commit = data["rows"], data.get("header", {}).get("commit", "?")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"--skip-measured: expected a results.json written by this check, got {path!r} "
                             f"({type(exc).__name__}: {exc})") from None
        theirs = data.get("header", {}).get("device")
        if device is not None and theirs != device:
            print(f"--skip-measured: {path.strip()} was measured on {theirs}, not {device}: its rows run again",
                  flush=True)
            continue
        found.update({_row_key(r["section"], r): commit for r in rows
                      if r.get("section") in ROW_KEYS and "skipped" not in r and "error" not in r})
    return found


@dataclass
class CheckContext:
    part: str
    device: torch.device
    dry_run: bool
    deadline: float  # time.monotonic() at which the part should have finished
    log: Path  # one JSON object per line: {"section": ..., **row}
    work: Path  # scratch space (not returned)
    repo: Path | None  # the repository root when the check runs from a checkout (tests/ beside it)
    measured: dict[str, str] | None = None  # rows an earlier run measured (``measured_rows``): skipped here

    def record(self, section: str, **row) -> dict:
        row = {"section": section, **row}
        with open(self.log, "a") as fh:
            fh.write(json.dumps(row, default=_plain) + "\n")
        print(f"[{self.part}] " + _brief(row), flush=True)
        return row

    def left(self) -> float:
        """Seconds before the part's deadline."""
        return self.deadline - time.monotonic()

    def has_time(self, seconds: float, section: str, what: str) -> bool:
        """True if ``seconds`` remain; otherwise records ``what`` as skipped for time and returns False."""
        if self.left() >= seconds:
            return True
        self.record(section, skipped=what, reason=f"time: {self.left():.0f} s left of the part's limit, "
                                                  f"{seconds:.0f} s wanted")
        return False

    def measured_before(self, section: str, row: dict) -> bool:
        """True if an earlier run measured ``row`` (``--skip-measured``); then it is recorded as skipped."""
        commit = (self.measured or {}).get(_row_key(section, row))
        if commit is None:
            return False
        self.record(section, skipped=f"{row}", reason=f"measured by the earlier run at commit {commit}")
        return True

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _plain(value):
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return repr(value)


def _brief(row: dict) -> str:
    cells = []
    for k, v in row.items():
        if isinstance(v, float):
            v = f"{v:.3g}"
        cells.append(f"{k}={v}")
    return " ".join(cells)[:240]


def rel_error(got: torch.Tensor, want: torch.Tensor, *, zero_scale: float | None = None) -> float:
    """‖got − want‖ / ‖want‖ in float64 (inf when got has a non-finite value). Where want is exactly zero the
    error is divided by ``zero_scale`` (the size of related values), or, without it, is the plain ‖got‖."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if not torch.isfinite(got).all():
        return math.inf
    denom = want.norm().item() or zero_scale
    num = (got - want).norm().item()
    return num / denom if denom else num


def median_time(fn, ctx: CheckContext, *, reps: int = 20, warmup: int = 2) -> float:
    """Median milliseconds of ``fn()``: ``triton.testing.do_bench`` on CUDA (device events), else host clock."""
    if ctx.device.type == "cuda":
        import triton.testing

        fn()
        ctx.sync()
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
