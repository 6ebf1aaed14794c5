"""Part 2, tests: the CUDA test suite (``pytest -m cuda tests/cuda``), then the Triton, window and conv test files
on the GPU, each in a ``pytest`` child process.

A part of its own, so that it has its own time limit: inside the correctness part it came after the scan's grid
and was never reached on the H100 (2026-11-26 to 2026-11-28). ``pytest`` runs verbose, so that a suite stopped at
the part's limit still says, test by test, what passed; the child counts its Triton kernels into the part's
loaded / compiled column (``pytest_plugin``)."""
from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

from .context import CheckContext
from .importable import child_env
from .pytest_plugin import LISTEN_VARIABLE

# the CUDA tests, in the order tests/cuda/conftest.py gives them: the new ones first, the CUDA-graph captures after
# them, the tests that compile a model with Inductor last in each file, the windows and the conv (which the
# correctness part has checked on the GPU) at the end
CUDA_TESTS = ["-m", "cuda", "tests/cuda"]
TRITON_TEST_FILES = ["tests/kernels/test_complex_scan_triton.py", "tests/kernels/test_complex_scan_varlen.py",
                     "tests/kernels/test_window_attention.py", "tests/kernels/test_causal_conv.py"]
MIN_SECONDS = 20  # less is not enough to import torch, collect and start CUDA
_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def outcomes(log: str) -> dict[str, int]:
    """How many tests ``pytest -v`` printed as each outcome, by the lines it prints as it goes (a run killed at
    its limit prints no summary)."""
    return dict(Counter(m.group(2).lower() for m in map(_OUTCOME.match, log.splitlines()) if m))


def failed_tests(log: str) -> list[str]:
    """The failed and erroring tests' ids, from the verbose lines or the ``-rfE`` summary, once each."""
    names = [m.group(1) for m in map(_OUTCOME.match, log.splitlines()) if m and m.group(2) in ("FAILED", "ERROR")]
    names += [line.split(" ", 1)[1].split(" - ")[0] for line in log.splitlines()
              if line.startswith(("FAILED ", "ERROR ")) and " " in line]
    return list(dict.fromkeys(names))


def run_pytest(ctx: CheckContext, args: list[str]) -> None:
    """``pytest args`` in a child process, until the part's deadline. Its log goes back as pytest.log."""
    if ctx.repo is None or not (ctx.repo / "tests").is_dir():
        ctx.record("pytest", skipped=" ".join(args), reason="no tests/ folder beside the package (not a checkout)")
        return
    limit = ctx.left() - 5
    if limit < MIN_SECONDS:
        ctx.record("pytest", skipped=" ".join(args), reason=f"time: {ctx.left():.0f} s left")
        return
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE", "--durations=15",
           "-p", f"{__package__}.pytest_plugin", *args]
    env = dict(child_env(ctx.work), **{LISTEN_VARIABLE: str(ctx.work / f"{ctx.part}.triton")})
    try:
        done = subprocess.run(cmd, cwd=ctx.repo, env=env, capture_output=True, text=True, timeout=limit)
        out, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out = "".join(s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
                      for s in (exc.stdout, exc.stderr))
        rc = "timeout"
    with open(ctx.work / "pytest.log", "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n{out}\n")
    lines = out.strip().splitlines()
    if rc == "timeout":  # no summary line, but the verbose lines say what finished
        summary = "stopped at the part's limit after " + (
            ", ".join(f"{n} {k}" for k, n in outcomes(out).items()) or "no test")
    else:
        summary = lines[-1].strip("= ") if lines else ""
    ctx.record("pytest", target=" ".join(args), returncode=rc, summary=summary,
               failed=failed_tests(out)[:20], ok=rc == 0)


def run(ctx: CheckContext) -> None:
    """The CUDA tests first (no GPU has run them yet), then the test files that run on the GPU when there is
    one (on the CPU they ran in CI already, so a dry run leaves them out)."""
    run_pytest(ctx, CUDA_TESTS)
    if not ctx.dry_run:
        run_pytest(ctx, TRITON_TEST_FILES)
