"""``python -m hybrid.train.data.carry_corpus --out DIR [--max-mib 48]``: a corpus folder to carry to a machine
without network (the lent GPU machine, docs/gpu.md), built from every installed package's sources and docs.

The running Python's site-packages hold far more text than its standard library (the default corpus, ~12M
bytes). This copies, byte for byte, their ``.py`` / ``.pyi`` sources, ``.md`` / ``.rst`` / ``.txt`` docs and each
distribution's ``METADATA`` or ``PKG-INFO`` (its README) into ``DIR``, one file per document, at its path under site-packages:
``--data DIR`` reads it as plain text, one document a file, which the byte tokenizer takes as it is.

- Deterministic and fair by bytes: the packages (top-level entries of site-packages) in sorted order, each
  package's files in sorted order; the next file always comes from the package that has given the fewest bytes
  so far, so every package contributes and the largest (transformers, torch, chardet's tables) are cut first.
  The same installation gives the same folder (``digest``).
- Deduplicated by content (the first copy in that order is kept); empty files, files over ``MAX_FILE_BYTES``,
  files that are not UTF-8 or hold a NUL byte are left out, as are ``__pycache__``, hidden entries and the
  folders the corpus reader skips (``sources._list_files``).
- Size-capped: the choice stops at the first file that would take the folder past ``--max-mib``, so that
  the repository, the carried wheels and this folder stay under the device's 64 MiB.

The folder is written beside ``DIR`` and renamed into place when complete; ``DIR`` must not exist yet.

``--pinned`` reads pinned pure-Python wheels instead of this installation (``pinned_corpus``): the same folder
on any machine, its digest checked. docs/gpu.md carries that one.
"""
from __future__ import annotations

import argparse
import hashlib
import heapq
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

__all__ = ["site_dirs", "package_files", "choose", "build", "main", "SUFFIXES", "MAX_FILE_BYTES"]

SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt")
MAX_FILE_BYTES = 1 << 20  # a larger file is generated tables or data, not prose or code
# never copied: caches, and the folders the corpus reader itself skips (sources._SKIP_DIRS)
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "dist-packages"}


def site_dirs() -> list[Path]:
    """The running Python's site-packages folders (purelib, platlib), each once, that exist."""
    paths = sysconfig.get_paths()
    out = []
    for key in ("purelib", "platlib"):
        path = Path(paths[key])
        if path.is_dir() and path.resolve() not in [p.resolve() for p in out]:
            out.append(path)
    return out


def _wanted(path: Path) -> bool:
    if path.name.startswith("."):
        return False
    if any(part.endswith((".dist-info", ".egg-info")) for part in path.parts[:-1]):
        return path.name in ("METADATA", "PKG-INFO")  # the README; the rest lists files
    return path.suffix in SUFFIXES


def package_files(site: Path) -> dict[str, list[Path]]:
    """``{top-level entry: its wanted files, sorted by path}`` of one site-packages folder (a top-level module
    file is a package of one file)."""
    site = Path(site)
    out: dict[str, list[Path]] = {}
    for entry in sorted(site.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name in SKIP_DIRS or entry.is_symlink():
            continue
        if entry.is_file():
            files = [entry] if _wanted(entry.relative_to(site)) else []
        else:
            files = []
            for dirpath, dirnames, filenames in os.walk(entry):
                dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
                files += [Path(dirpath, f) for f in filenames if _wanted(Path(dirpath, f).relative_to(site))]
            files.sort(key=lambda p: p.relative_to(site).as_posix())
        if files:
            out[entry.name] = files
    return out


def _text(path: Path) -> bytes | None:
    """The file's bytes when they make a document: non-empty, at most MAX_FILE_BYTES, UTF-8, no NUL."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = path.read_bytes()
        if not data.strip() or b"\0" in data:
            return None
        data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return data


def choose(sites: list[Path], max_bytes: int):
    """Yield ``(relative path, bytes)``, each time from the package that has given the fewest bytes so far (the
    first in order on a tie), until the next file would pass ``max_bytes``."""
    queues = []  # one iterator per package, over every site folder's packages in order
    for site in sites:
        for files in package_files(site).values():
            queues.append(iter([(f, f.relative_to(site).as_posix()) for f in files]))
    turns = [(0, i) for i in range(len(queues))]  # (bytes given, package): a heap
    seen_content, seen_paths, total = set(), set(), 0
    while turns:
        given, i = heapq.heappop(turns)
        for path, relative in queues[i]:  # the package's next usable file
            data = _text(path)
            if data is None or relative in seen_paths:
                continue
            digest = hashlib.sha256(data).digest()
            if digest not in seen_content:
                break
        else:
            continue  # this package is done
        if total + len(data) > max_bytes:
            return
        seen_content.add(digest)
        seen_paths.add(relative)
        total += len(data)
        heapq.heappush(turns, (given + len(data), i))
        yield relative, data


def _new_folder(out) -> Path:
    out = Path(out)
    if out.exists():
        raise ValueError(f"--out: expected a folder that does not exist yet, got {out}")
    return out


def build(out, *, max_bytes: int, sites: list[Path] | None = None) -> dict:
    """Write the corpus into ``out`` (which must not exist); return ``{"files", "bytes", "packages", "digest"}``
    (digest: sha256 over every path and its bytes, in order)."""
    out = _new_folder(out)
    if max_bytes <= 0:
        raise ValueError(f"max_bytes: expected a positive size, got {max_bytes}")
    sites = site_dirs() if sites is None else [Path(s) for s in sites]
    partial = out.with_name(out.name + ".partial")
    if partial.exists():  # an earlier build that did not finish
        import shutil

        shutil.rmtree(partial)
    digest, files, size, packages = hashlib.sha256(), 0, 0, set()
    for relative, data in choose(sites, max_bytes):
        target = partial / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        digest.update(relative.encode() + b"\0" + data + b"\0")
        files, size = files + 1, size + len(data)
        packages.add(relative.split("/", 1)[0])
    partial.mkdir(parents=True, exist_ok=True)
    os.replace(partial, out)
    return {"files": files, "bytes": size, "packages": len(packages), "digest": digest.hexdigest()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.data.carry_corpus", allow_abbrev=False,
                                description="Copy every installed package's sources and docs into one folder of "
                                            "plain-text documents (--data DIR), deterministic and size-capped.")
    p.add_argument("--out", required=True, help="the corpus folder to write (must not exist yet)")
    p.add_argument("--max-mib", type=float, default=48.0,
                   help="the folder's size cap in MiB (default: 48, for the device's 64 MiB with the repository)")
    p.add_argument("--site", action="append", default=None, metavar="DIR",
                   help="a site-packages folder to read, repeatable (default: the running Python's)")
    p.add_argument("--pinned", action="store_true",
                   help="read the pinned pure-Python wheels instead (pinned_corpus.py): the same folder on any "
                        "machine, its digest checked; what docs/gpu.md carries")
    p.add_argument("--wheels", type=Path, default=None, metavar="DIR",
                   help="where --pinned keeps the downloaded wheels (default: <HYBRID_CACHE>/corpus-wheels)")
    return p


def _pinned_site(wheels: Path | None, scratch: Path) -> Path:
    from . import pinned_corpus
    from .prepare import default_cache_dir

    folder = wheels if wheels is not None else default_cache_dir() / "corpus-wheels"
    return pinned_corpus.unpack(pinned_corpus.download(folder), scratch / "site-packages")


def _check_pinned(out: Path, summary: dict, max_mib: float) -> None:
    """A pinned build at the pinned size must give the pinned folder; another one is removed, not carried."""
    from .pinned_corpus import PINNED_DIGEST, PINNED_MAX_MIB

    if max_mib == PINNED_MAX_MIB and summary["digest"] != PINNED_DIGEST:
        import shutil

        shutil.rmtree(out)
        raise ValueError(f"--pinned: expected sha256 {PINNED_DIGEST}, got {summary['digest']} (removed {out}): "
                         f"the wheels or the selection rules changed")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not 0 < args.max_mib < float("inf"):
            raise ValueError(f"--max-mib: expected a positive number of MiB, got {args.max_mib:g}")
        if args.pinned and args.site is not None:
            raise ValueError("--pinned: expected no --site beside it (it reads the pinned wheels), got both")
        sites = None if args.site is None else [Path(s) for s in args.site]
        for site in sites or []:
            if not site.is_dir():
                raise ValueError(f"--site: expected a folder, got {site}")
        _new_folder(args.out)  # before any download
        with tempfile.TemporaryDirectory(prefix="carry_corpus_") as scratch:
            if args.pinned:
                sites = [_pinned_site(args.wheels, Path(scratch))]
            summary = build(args.out, max_bytes=int(args.max_mib * 2**20), sites=sites)
        if args.pinned:
            _check_pinned(Path(args.out), summary, args.max_mib)
    except ValueError as e:
        print(f"carry_corpus: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {summary['files']:,} files from {summary['packages']} packages, {summary['bytes']:,} bytes "
          f"({summary['bytes'] / 2**20:.1f} MiB), sha256 {summary['digest']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
