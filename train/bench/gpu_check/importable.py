"""The installed namespace for a child process, however this one found it.

On the device machine the library is not pip-installed: ``hybrid/`` holds links to ``kernels/``, ``models/`` and
``train/`` and the checkout's root is on ``PYTHONPATH`` (docs/gpu.md). ``tests/conftest.py`` takes that root off
``sys.path`` (a checkout's ``kernels/`` must not import as a top-level ``kernels``), so ``pytest`` there found no
``hybrid`` (the H100 run of 2026-11-27). A folder holding only a ``hybrid`` made of links to the imported package's
files and subpackages gives the child the same modules, wherever they were found, and nothing else.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

SUBPACKAGES = ("kernels", "models", "train")


def package_site(work: Path) -> Path:
    """``work/site``, where ``import hybrid`` (and its subpackages) finds the modules this process imported."""
    import hybrid

    site = Path(work) / "site"
    root = site / "hybrid"
    root.mkdir(parents=True, exist_ok=True)
    own = Path(hybrid.__file__).resolve().parent
    targets = {entry.name: entry for entry in own.iterdir() if entry.name not in SUBPACKAGES}
    for name in SUBPACKAGES:
        targets[name] = Path(importlib.import_module(f"hybrid.{name}").__file__).resolve().parent
    for name, target in targets.items():
        link = root / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            link.unlink()
        link.symlink_to(target, target_is_directory=target.is_dir())
    return site


def child_env(work: Path) -> dict[str, str]:
    """This process's environment with ``package_site(work)`` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_site(work)), env.get("PYTHONPATH")) if p)
    return env
