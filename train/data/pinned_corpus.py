"""The carried corpus from pinned wheels: the same folder, byte for byte, on any machine with the package index.

``carry_corpus`` copies the sources of a site-packages folder. Built from the running installation, the corpus
changed with it: on 2026-11-27 one sandbox's `.venv` gave 233 packages and sha256 797d488d…, and a fresh
`make install` in a later session gave 150 packages and e394c608…. A suite that began on one and continued on the
other would compare models trained and scored on different text. Pure-Python wheels at pinned versions are the
same files everywhere (no platform, no build), so the folder made from them is too, and its digest is checked.

The wheels are fetched once with ``pip download`` (into ``<HYBRID_CACHE>/corpus-wheels``) and unpacked as pip
would lay them out in site-packages, without their ``.data`` folders (scripts and headers).
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

# Large, well-known pure-Python projects (code, docstrings, docs), as the index had them on 2026-11-27.
PINNED_WHEELS = (
    "astroid==4.3.4", "django==6.1.3", "docutils==0.23", "flask==3.1.3", "hypothesis==6.155.7",
    "ipython==9.18.1", "jedi==0.20.1", "jinja2==3.1.6", "networkx==3.7", "nltk==3.10.4", "pip==26.3",
    "pygments==2.21.0", "pylint==4.1.4", "requests==2.34.2", "rich==15.0.0", "setuptools==84.2.1",
    "sphinx==9.1.1", "sqlalchemy==2.1.9", "sympy==1.14.0", "textual==8.2.8", "transformers==5.24.0",
    "twisted==26.10.0", "werkzeug==3.1.9",
)
PINNED_MAX_MIB = 48.0
PINNED_DIGEST = "4bbe31cf1a669e09eee6cef2c98d660c7d44dc3e2e9af8fcde04652d754823a4"  # at PINNED_MAX_MIB


def _wheel_name(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{name.replace('-', '_').lower()}-{version}-"


def download(folder: Path, requirements=PINNED_WHEELS) -> list[Path]:
    """The pinned wheels in ``folder``, fetched with pip where missing; pure-Python ones only."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    missing = [r for r in requirements if not _find(folder, r)]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "py", "--platform", "any", "-d", str(folder),
               *missing]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or ["pip failed"]
            raise ValueError(f"pinned wheels: expected pip to download {len(missing)} pure-Python wheels into "
                             f"{folder}, got: {lines[0]}")
    found = [_find(folder, r) for r in requirements]
    absent = [r for r, path in zip(requirements, found) if path is None]
    if absent:
        raise ValueError(f"pinned wheels: expected every wheel in {folder}, got none for {', '.join(absent)}")
    return found


def _find(folder: Path, requirement: str) -> Path | None:
    prefix = _wheel_name(requirement)
    matches = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix))
    return matches[0] if matches else None


def unpack(wheels: list[Path], site: Path) -> Path:
    """Lay ``wheels`` out in ``site`` as site-packages holds them (their ``.data`` folders left out)."""
    site = Path(site)
    site.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if not n.split("/", 1)[0].endswith(".data")]
            archive.extractall(site, names)
    return site
