"""Which sources the committed prewarm compiled: each Triton function of the scan with its cache key, and the
tiles its autotuner may pick, in ``docs/research/gpu/prewarm_sources.json`` beside the cache it describes.

A device session finds a prewarmed kernel only while its source is the one compiled (docs/gpu.md, "The scan's
kernels compiled here"). A kernel changed without the prewarm run again costs the next session its compiles, and
nothing would say so until then; CI compares this file with the sources (``tests/train/bench/gpu_check/
test_prewarm_sources.py``). Triton's key of a function's source (``JITFunction.cache_key``: its text, the
functions it calls, the globals it reads) is the same under Triton 3.6 and 3.9. It is computed in a child process
without ``TRITON_INTERPRET``, under which Triton makes no such key. Not covered: the launch code's choices
(which flags and untuned tiles a call takes), which the prewarm replays.

    python -m hybrid.train.bench.gpu_check.prewarm_sources [--write FILE | --check FILE]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

MODULES = ("hybrid.kernels.complex_scan.triton_device", "hybrid.kernels.complex_scan.triton_runs",
           "hybrid.kernels.complex_scan.triton_scan")
DEFAULT_FILE = Path("docs/research/gpu/prewarm_sources.json")

__all__ = ["MODULES", "DEFAULT_FILE", "current", "changes", "main"]


def _here() -> dict[str, dict]:
    """``{"module.name": {"key": ...}}`` for this process's Triton (not interpreted): each Triton function's
    ``cache_key``, and each list of tiles the autotuner may pick (``*_CONFIGS``) as its text."""
    from triton.runtime.jit import JITFunction

    found: dict[str, dict] = {}
    seen: set[int] = set()
    for name in MODULES:
        module = importlib.import_module(name)
        short = name.rsplit(".", 1)[-1]
        for attr, obj in vars(module).items():
            if attr.endswith("_CONFIGS") and id(obj) not in seen:  # once, where first found (others import it)
                seen.add(id(obj))
                found[f"{short}.{attr}"] = {"key": repr(obj)}
            elif isinstance(obj, JITFunction) and obj.fn.__module__ == name:
                found[f"{short}.{attr}"] = {"key": obj.cache_key}
    return dict(sorted(found.items()))


def current() -> dict[str, dict]:
    """``_here()`` computed in a child process with ``TRITON_INTERPRET`` unset."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import json, hybrid.train.bench.gpu_check.prewarm_sources as m; print(json.dumps(m._here()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"prewarm_sources: could not read the kernels' keys: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def changes(recorded: dict, now: dict) -> list[str]:
    """What differs between a recorded file's ``functions`` and ``now``: one line per function."""
    lines = [f"{name}: new since the prewarm" for name in now if name not in recorded]
    lines += [f"{name}: gone since the prewarm" for name in recorded if name not in now]
    for name in now:
        if name in recorded and recorded[name].get("key") != now[name]["key"]:
            what = "its tiles" if name.endswith("_CONFIGS") else "its source (or a function it calls)"
            lines.append(f"{name}: {what} changed since the prewarm")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.gpu_check.prewarm_sources", allow_abbrev=False,
                                description="Record, or check, the scan kernels' sources the prewarm compiled.")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="FILE", help="record this checkout's kernels in FILE")
    group.add_argument("--check", type=Path, metavar="FILE", help="compare FILE with this checkout's kernels")
    p.add_argument("--note", default="", help="a line kept in the file (--write), e.g. the commit")
    args = p.parse_args(argv)
    now = current()
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps({"note": args.note, "functions": now}, indent=1) + "\n")
        print(f"prewarm_sources: {len(now)} functions recorded in {args.write}")
        return 0
    path = args.check or DEFAULT_FILE
    recorded = json.loads(path.read_text())["functions"] if path.is_file() else {}
    lines = changes(recorded, now)
    print("\n".join(lines) if lines else f"prewarm_sources: the {len(now)} functions are those of {path}")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
