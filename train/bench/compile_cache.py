"""Carry Triton's and torch.compile's caches from one device session to the next.

A lent device machine starts bare, so every session compiles every Triton kernel, autotunes every scan tile and
compiles every Inductor graph again. On 2026-11-27 the `gpu-long` budget's first model took 190 s, of which 22 s
were training, and autotuning took most of the check's scan part. This wraps any command:

    python -m hybrid.train.bench.compile_cache [--base FILE] [--restore FILE] [--save FILE] [--root DIR]
        -- COMMAND [ARG ...]

1. ``--restore`` unpacks an earlier session's caches into ``--root`` (a missing file is a cold start); ``--base``
   first unpacks a file that travels on its own (the prewarm's kernels, made without a GPU: ``gpu_check.prewarm``),
   whose entries the save then leaves out, so that what a session adds fits its own file;
2. the command runs with Triton (``TRITON_CACHE_DIR``) and Inductor (``TORCHINDUCTOR_CACHE_DIR``) pointed there;
3. ``--save`` packs the root into one ``.tgz`` that fits what the device tool brings back (one file of at most
   16 MiB). Triton's intermediate texts (``.ttir``, ``.ttgir``, ``.llir``, ``.ptx``, ``.source``) stay behind:
   a cache hit loads only the binary and its metadata, and the texts are three quarters of the bytes. Past the
   cap Inductor's graphs stay behind, then as many of Triton's kernels as it takes (``save``).

Every entry is keyed by a hash of its source, compiler versions and options, so a changed kernel or another
torch simply misses. Triton's group files name their members by absolute path; a restore rewrites them for
the new root. Inductor's kernels are kept once, in Triton's folder, not also inside its graph entries.
"""
from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zlib
from importlib import metadata
from pathlib import Path

from .triton_rekey import SIDECAR, rekey

MANIFEST = "compile_cache.json"
TRITON_TEXTS = (".ttir", ".ttgir", ".llir", ".ptx", ".source", ".amdgcn")
DEFAULT_MAX_MIB = 15.0  # the device tool brings back files of at most 16 MiB
NOTE_VARIABLE = "HYBRID_COMPILE_CACHE"  # the command learns what was restored


def environment(root: Path) -> dict[str, str]:
    """The variables that point Triton and Inductor at ``root``."""
    return {"TRITON_CACHE_DIR": str(root / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            # Inductor's graph entries would otherwise hold a second copy of each kernel, texts included
            "TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE": "0"}


def census(root: Path) -> dict[str, int]:
    """What a cache root holds: compiled Triton kernels, autotuning results, Inductor graphs, and bytes."""
    root = Path(root)
    triton, inductor = root / "triton", root / "inductor"
    files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
    return {"triton_kernels": sum(1 for p in files if p.name.startswith("__grp__") and triton in p.parents),
            "autotunings": sum(1 for p in files if p.name.endswith(".autotune.json")),
            "inductor_graphs": sum(1 for p in files if (inductor / "fxgraph") in p.parents),
            "bytes": sum(p.stat().st_size for p in files)}


def describe(counts: dict) -> str:
    return (f"{counts['triton_kernels']} Triton kernels, {counts['autotunings']} autotunings, "
            f"{counts['inductor_graphs']} Inductor graphs")


def _versions() -> dict[str, str]:
    """This wrapper's Python, torch and Triton (its command may run others: ``kernel_builds`` says which)."""
    found = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in ("torch", "triton"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def kernel_builds(root: Path, left_out: frozenset = frozenset()) -> dict[str, int]:
    """How many of ``root``'s Triton kernels each Triton release compiled, for which target, from the kernels'
    own metadata: ``{"Triton 3.6.0, cuda sm_90": n}``. The wrapper's own versions can differ: a prewarm runs
    the device's Triton under another one."""
    counts: dict[str, int] = {}
    for entry in _triton_entries(Path(root)):
        if entry in left_out:
            continue
        for group in entry.glob("__grp__*.json"):
            try:
                meta = json.loads((entry / group.name.removeprefix("__grp__")).read_text())
                target = meta["target"]
                build = f"Triton {meta['triton_version']}, {target['backend']} sm_{target['arch']}"
            except (OSError, ValueError, KeyError, TypeError):
                build = "unknown"
            counts[build] = counts.get(build, 0) + 1
    return dict(sorted(counts.items()))


def _is_triton_text(path: Path) -> bool:
    return path.suffix in TRITON_TEXTS


def _group_without_texts(path: Path) -> bytes | None:
    """A Triton group file listing only the members that are packed, or None if it is not one."""
    try:
        group = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    members = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(members, dict):
        return None
    kept = {name: p for name, p in members.items() if not _is_triton_text(Path(p))}
    return json.dumps({**group, "child_paths": kept}).encode()


def _packed_files(entry: Path) -> list[Path]:
    """The files of ``entry`` (or ``entry`` itself, a file) that a save packs: no locks, no Triton texts."""
    paths = sorted(entry.rglob("*")) if entry.is_dir() else [entry]
    return [p for p in paths if p.is_file() and p.suffix != ".lock" and not _is_triton_text(p)]


def _pack(root: Path, target: Path, parts: tuple[str, ...], note: str, left_out: frozenset = frozenset()) -> None:
    """Write ``parts`` of ``root`` (its subfolders' names), less the entries ``left_out`` (folders), and a
    manifest into the gzipped tar ``target``."""
    manifest = {"root": str(root.resolve()), "made": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
                "note": note, "parts": list(parts), **_versions(), "kernels": kernel_builds(root, left_out)}
    with tarfile.open(target, "w:gz") as tar:
        for part in parts:
            for path in _packed_files(root / part):
                if path.parent in left_out or path in left_out:
                    continue
                name = str(path.relative_to(root))
                body = _group_without_texts(path) if path.name.startswith("__grp__") else None
                if body is None:
                    tar.add(path, arcname=name, recursive=False)
                else:
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(body), int(path.stat().st_mtime)
                    tar.addfile(info, io.BytesIO(body))
        body = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))


def _triton_entries(root: Path) -> list[Path]:
    """Triton's cache entries under ``root``: one folder per compiled kernel or autotuning, named by its key."""
    folder = root / "triton"
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _keep_first(entry: Path) -> tuple:
    """The order in which a trimmed save keeps Triton's entries: the library's own kernels (those a prewarm made
    among them) and the autotunings first, then Inductor's generated kernels (``triton_*``); newest first."""
    names = [p.name for p in entry.iterdir()]
    inductors = any(n.startswith("__grp__triton_") for n in names)
    tuned = any(n.endswith(".autotune.json") for n in names)
    newest = max((p.stat().st_mtime for p in entry.iterdir()), default=0.0)
    return (inductors and not tuned, -newest, entry.name)


def _packed_cost(entry: Path) -> int:
    """About how many bytes ``entry`` adds to a saved file: its packed files compressed, plus their headers."""
    files = _packed_files(entry)
    return len(zlib.compress(b"".join(p.read_bytes() for p in files), 9)) + 64 * len(files)


def _pack_if_fits(root: Path, target: Path, parts: tuple[str, ...], note: str, left_out: frozenset,
                  limit: float) -> int:
    """Pack as ``_pack`` does, into ``target`` only if the file is at most ``limit`` bytes; returns its size."""
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".part", delete=False) as handle:
        scratch = Path(handle.name)
    try:
        _pack(root, scratch, parts, note, left_out)
        size = scratch.stat().st_size
        if size <= limit:
            umask = os.umask(0)
            os.umask(umask)
            scratch.chmod(0o666 & ~umask)  # a temporary file is private; the saved one reads like any other
            os.replace(scratch, target)
        return size
    finally:
        scratch.unlink(missing_ok=True)


def _census_of(entries) -> dict[str, int]:
    """``census``'s Triton counts over some of Triton's entries (folders)."""
    names = [p.name for entry in entries for p in entry.iterdir() if p.is_file()]
    return {"triton_kernels": sum(n.startswith("__grp__") for n in names),
            "autotunings": sum(n.endswith(".autotune.json") for n in names)}


def _saved(root: Path, target: Path, size: int, parts: tuple[str, ...], left_out: frozenset,
           based: frozenset = frozenset()) -> str:
    counts, gone, carried = census(root), _census_of(left_out), _census_of(based)
    left = [] if "inductor" in parts else [f"{counts['inductor_graphs']} Inductor graphs"]
    if left_out:
        left.append(f"{gone['triton_kernels']} Triton kernels and {gone['autotunings']} autotunings")
    counts["inductor_graphs"] *= "inductor" in parts
    for kind in ("triton_kernels", "autotunings"):
        counts[kind] -= gone[kind] + carried[kind]
    said = f"compile cache: saved {describe(counts)} to {target} ({size / 2 ** 20:.1f} MiB)"
    if based:
        said += f", not the {carried['triton_kernels']} Triton kernels of --base"
    return said + (f"; {' and '.join(left)} left out to fit" if left else "")


def save(root: Path, target: Path, max_mib: float = DEFAULT_MAX_MIB, note: str = "",
         base: frozenset = frozenset()) -> str:
    """Pack ``root`` into ``target``, but for Triton's entries named in ``base`` (``restore_base``'s): everything
    if it fits in ``max_mib``; else Triton's part alone; else as many of Triton's entries as fit, the library's
    kernels and the autotunings first (``_keep_first``); else nothing. Returns one line saying which."""
    root, target = Path(root), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    limit = max_mib * 2 ** 20
    based = frozenset(p for p in _triton_entries(root) if p.name in base)
    # the prewarm's key sidecar travels with --base's file
    unsaved = based | ({root / "triton" / SIDECAR} if based else set())
    for parts in (("triton", "inductor"), ("triton",)):
        size = _pack_if_fits(root, target, parts, note, unsaved, limit)
        if size <= limit:
            return _saved(root, target, size, parts, frozenset(), based)
    entries = sorted((p for p in _triton_entries(root) if p not in based), key=_keep_first)
    costs = {entry: _packed_cost(entry) for entry in entries}
    aim = 0.95 * limit
    for _ in range(6):  # each try aims lower by how far the last one missed
        kept, total = [], 0
        for entry in entries:
            if total + costs[entry] <= aim:
                kept.append(entry)
                total += costs[entry]
        if not kept:
            break
        left_out = frozenset(entries) - frozenset(kept)
        size = _pack_if_fits(root, target, ("triton",), note, left_out | unsaved, limit)
        if size <= limit:
            return _saved(root, target, size, ("triton",), left_out, based)
        aim *= 0.97 * limit / size
    return f"compile cache: not saved: not even one of Triton's kernels packs into --max-mib {max_mib:g}"


def _relocate_groups(root: Path, old_root: str) -> None:
    """Point every restored Triton group file's members at ``root`` instead of the root they were packed from."""
    new_root = str(root.resolve())
    for path in root.rglob("__grp__*"):
        group = json.loads(path.read_text())
        members = group.get("child_paths", {})
        group["child_paths"] = {name: new_root + p[len(old_root):] if p.startswith(old_root + os.sep) else p
                                for name, p in members.items()}
        path.write_text(json.dumps(group))


def restore_base(source: Path, root: Path) -> tuple[str, frozenset]:
    """``restore`` of a file that travels on its own; also returns the names of Triton's entries it left in
    ``root`` (after renaming for this build), which ``save`` leaves out. A missing file holds none."""
    said, members = _restore(source, root)
    names = {Path(m).parts[1] for m in members if m.startswith("triton/") and len(Path(m).parts) > 2}
    sidecar = Path(root) / "triton" / SIDECAR  # renamed entries: the names they have now
    if members and sidecar.is_file():
        names |= set(json.loads(sidecar.read_text()))
    return said, frozenset(n for n in names if (Path(root) / "triton" / n).is_dir())


def restore(source: Path, root: Path) -> str:
    """Unpack ``source`` into ``root`` (a missing file is a cold start). Returns one line saying what it did."""
    return _restore(source, root)[0]


def _restore(source: Path, root: Path) -> tuple[str, list[str]]:
    """``restore``'s line, and the names of the members it unpacked (none for a missing file): the file is
    read once."""
    source, root = Path(source), Path(root)
    if not source.is_file():
        return f"compile cache: cold start: no file at {source}", []
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(source, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name != MANIFEST]
        manifest = json.load(tar.extractfile(MANIFEST))
        tar.extractall(root, members=members, filter="data")
    _relocate_groups(root, manifest["root"])
    try:  # prewarmed kernels made for another build of this Triton release
        renamed = rekey(root / "triton")
    except Exception as exc:  # noqa: BLE001 - the kernels stay under their names: they compile again
        renamed = f"compile cache: prewarmed Triton kernels not renamed: {type(exc).__name__}: {exc}"
    made = ", ".join(f"{k} {manifest[k]}" for k in ("made", "torch") if manifest.get(k))
    builds = manifest.get("kernels") or ({"Triton " + manifest["triton"]: None} if manifest.get("triton") else {})
    made += "".join(f", {build}" + (f" ×{n}" if n else "") for build, n in builds.items())
    note = f", {manifest['note']}" if manifest.get("note") else ""
    said = (f"compile cache: restored {source} into {root}, which holds {describe(census(root))} (packed {made}"
            f"{note})" + (f"; {renamed.removeprefix('compile cache: ')}" if renamed else ""))
    return said, [m.name for m in members]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.compile_cache", allow_abbrev=False,
                                description="Run a command with Triton's and Inductor's caches restored from, "
                                            "and saved to, one file (docs/gpu.md).")
    p.add_argument("--base", type=Path, help="a .tgz restored first whose Triton kernels --save leaves out "
                                             "(the prewarm's, committed apart; missing: none)")
    p.add_argument("--restore", type=Path, help="a .tgz saved by an earlier run (missing: a cold start)")
    p.add_argument("--save", type=Path, help="where to pack the caches after the command (.tgz)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --save file")
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "hybrid-compile-cache",
                   help="the cache folder the command uses (default: %(default)s)")
    p.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB,
                   help="largest --save file; past it, Inductor's graphs are left out, then Triton's kernels, "
                        "Inductor's and the oldest first (default: %(default)s)")
    p.add_argument("--note", default="", help="a line kept in the saved file's manifest, e.g. the commit")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    problem = None
    if not command:
        problem = "COMMAND: expected '-- COMMAND [ARG ...]' to run, got nothing"
    elif args.save is not None and args.save.exists() and not args.overwrite:
        problem = f"--save: expected a new file (or --overwrite), got {args.save}, which exists"
    elif args.max_mib <= 0:
        problem = f"--max-mib: expected a size > 0, got {args.max_mib:g}"
    if problem:
        print(f"compile_cache: {problem}", file=sys.stderr)
        return 2
    base: frozenset = frozenset()
    said = []
    for source, is_base in ((args.base, True), (args.restore, False)):
        if source is None:
            continue
        try:
            if is_base:
                line, base = restore_base(source, args.root)
            else:
                line = restore(source, args.root)
        except (OSError, tarfile.TarError, ValueError, KeyError) as exc:  # a bad file costs a cold start only
            line = f"compile cache: cold start: could not restore {source}: {type(exc).__name__}: {exc}"
        said.append(line)
    if not said:
        said.append(f"compile cache: {describe(census(args.root))} already in {args.root}")
    print("\n".join(said), flush=True)
    # the note reaches the command's reports (gpu_check's header), so its compile seconds read right
    env = {**os.environ, **environment(args.root),
           NOTE_VARIABLE: "; ".join(line.removeprefix("compile cache: ") for line in said)}
    child = subprocess.Popen(command, env=env)
    try:
        rc = child.wait()
    except KeyboardInterrupt:  # the command gets the signal too: let it end, then keep what it compiled
        rc = child.wait()
    if args.save is not None:
        print(save(args.root, args.save, args.max_mib, args.note, base), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
