"""Which Triton kernels a process loaded from Triton's cache folder and which it compiled, one line each in a
file (``triton.knobs.compilation.listener``): a part killed at its limit still leaves its count, and a device
session sees whether the caches it was given (``compile_cache``, ``gpu_check.prewarm``) were used."""
from __future__ import annotations

from pathlib import Path

__all__ = ["listen", "summarize"]


def listen(path: Path) -> bool:
    """Append ``loaded NAME`` or ``compiled NAME SECONDS`` to ``path`` for every kernel Triton takes from its
    cache or compiles in this process (kernels already in the process's memory are neither). False where
    Triton is missing or has no compilation listener (before 3.4)."""
    try:
        from triton import knobs
    except ImportError:
        return False
    if not hasattr(getattr(knobs, "compilation", None), "listener"):
        return False
    path = Path(path)

    def on_compile(*, src, metadata, metadata_group, times, cache_hit, **_):
        name = str(getattr(src, "name", "?")).replace(" ", "_")
        line = f"loaded {name}" if cache_hit else f"compiled {name} {times.total / 1e6:.2f}"
        with path.open("a") as f:
            f.write(line + "\n")

    knobs.compilation.listener = on_compile
    return True


def summarize(path: Path) -> dict | None:
    """``{"loaded": n, "compiled": n, "compile_s": s}`` from a ``listen`` file; None if there is none."""
    path = Path(path)
    if not path.exists():
        return None
    loaded = compiled = 0
    seconds = 0.0
    for line in path.read_text().splitlines():
        kind, *rest = line.split()
        if kind == "loaded":
            loaded += 1
        elif kind == "compiled" and len(rest) == 2:
            compiled += 1
            seconds += float(rest[1])
    return {"loaded": loaded, "compiled": compiled, "compile_s": round(seconds, 1)}
