"""Build ``cpu_scan.cpp`` on first use and load it with ctypes; cached per source and compiler.

The library is built once per machine into ``kernels/`` of the library's cache, ``$HYBRID_CACHE`` (default
``$XDG_CACHE_HOME/hybrid`` or ``~/.cache/hybrid``, the same cache the data pipeline uses), named by a hash of
the source, the compile command and the compiler's version, so an edit or another compiler builds a new file
and a stale one is never loaded. Concurrent processes (pytest
workers, torchrun ranks) are safe without a lock: each compiles into its own temporary file and renames it
into place, an atomic step, so a reader sees either no file or a whole one; a process that loses the race
simply loads the winner's identical file. The build takes about a second (no torch headers).

``load()`` returns the ``ctypes.CDLL`` or ``None`` when no compiler is found or the build fails (the
caller then falls back to the torch backend). This file imports nothing of the package (concurrent builders
load it alone): the backend choice is made in ``interface.py`` and ``cpu_scan.available()``.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_scan.cpp")
FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fno-math-errno", "-fno-trapping-math"]


def cache_dir() -> Path:
    root = os.environ.get("HYBRID_CACHE")
    if root:
        return Path(root).expanduser() / "kernels"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybrid" / "kernels"


def compiler() -> str | None:
    """``$CXX``, else the first of c++, g++, clang++ on the PATH."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])
    return next((path for name in ("c++", "g++", "clang++") if (path := shutil.which(name))), None)


def _compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout


def library_path(cxx: str) -> Path:
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), _compiler_version(cxx).encode(),
                 sys.platform.encode(), platform.machine().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"cpu_scan_{key.hexdigest()[:16]}.so"


def build(cxx: str, target: Path) -> None:
    """Compile into a private temporary file beside ``target``, then rename it into place (atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cxx} failed:\n{done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i64, i32, i64s = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)
    for suffix in ("f32", "f64"):
        fwd = getattr(lib, f"scan_forward_{suffix}")
        fwd.argtypes = [p, p, p, i64s, p, p, p, i64, i64, i64, i64, i64, i32]
        fwd.restype = None
        bwd = getattr(lib, f"scan_backward_{suffix}")
        bwd.argtypes = [p, p, i64s, p, p, p, p, p, p, p, i64, p, i64, i64, i64, i64, i64, i32]
        bwd.restype = None
    lib.advise_huge_pages.argtypes = [p, i64]
    lib.advise_huge_pages.restype = None
    return lib


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled library (built on first use), or None with one warning saying why."""
    cxx = compiler()
    if cxx is None:
        warnings.warn("complex_scan: no C++ compiler found (set $CXX); the CPU scan uses the torch backend",
                      RuntimeWarning, stacklevel=2)
        return None
    try:
        path = library_path(cxx)
        if not path.exists():
            build(cxx, path)
        return _declare(ctypes.CDLL(str(path)))
    except Exception as err:  # noqa: BLE001 — any failure to build or load means: use the torch backend
        warnings.warn(f"complex_scan: building the CPU scan failed ({err}); using the torch backend",
                      RuntimeWarning, stacklevel=2)
        return None
