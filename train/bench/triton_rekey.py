"""Triton cache entries made by one build of a Triton release, renamed for another build of the same release.

Triton names a cache entry by a hash over its own build (``triton_key()``: its Python sources, version and the
``libtriton`` binary), the kernel's source, the backend (ptxas version and target), the options and a few
environment variables. The ``gpu_check.prewarm`` compiles on a machine without a GPU, keyed for the device's
Triton wheel from PyPI; a device whose Triton was built elsewhere from the same release (PyTorch's index hosts
its own builds) has another ``libtriton`` and so another key, and would load nothing. ``noting_keys`` writes, for
every entry compiled or loaded, the other parts of its key into ``prewarm_keys.json`` in the cache folder;
``rekey`` (run by ``compile_cache`` after a restore) moves each entry to the name this machine's Triton gives it
when only the binary differs: the same version and Python sources, the same ptxas and target. The compiler that
made the entry and the one that would have made it are built from the same sources.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from pathlib import Path

SIDECAR = "prewarm_keys.json"

__all__ = ["SIDECAR", "build_name", "identity", "this_build", "noting_keys", "rekey"]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _folder(hex_hash: str) -> str:
    """The cache folder's name for a key hash (Triton's ``_base32``)."""
    return base64.b32encode(bytes.fromhex(hex_hash)).decode("utf-8").rstrip("=")


def build_name(key: str) -> str:
    """A ``triton_key()``'s short name: the first 12 hex digits of its sha256 (the GPU check's report prints it)."""
    return _sha256(key)[:12]


def identity(key: str, libtriton_sha256: str) -> dict:
    """``{"build": …, "sources": …}`` of a ``triton_key()``: the build hashes it whole (``build_name``), the
    sources hash it with its ``libtriton`` digest blanked (equal for two builds of one release)."""
    return {"build": build_name(key), "sources": _sha256(key.replace(libtriton_sha256, "libtriton"))[:16]}


def this_build() -> tuple[str, dict]:
    """This Triton's ``triton_key()`` and its ``identity``."""
    import triton
    from triton.runtime.cache import triton_key

    library = Path(triton.__file__).parent / "_C" / "libtriton.so"
    key = triton_key()
    return key, identity(key, hashlib.sha256(library.read_bytes()).hexdigest())


@contextlib.contextmanager
def noting_keys(cache_dir: Path, build: dict):
    """Inside, every Triton compile (or load) notes its entry's key parts in ``cache_dir / SIDECAR``, for the
    build ``build`` (``identity``) its key names. Yields the entries noted so far (folder name → key parts)."""
    import triton.compiler.compiler as compiler

    get_cache_key = compiler.get_cache_key
    noted = {}

    def noting(src, backend, options, env_vars):
        key = get_cache_key(src, backend, options, env_vars)
        parts = [src.hash(), backend.hash(), options.hash(), str(sorted(env_vars.items()))]
        noted[_folder(_sha256(key))] = {"parts": parts, **build}
        return key

    compiler.get_cache_key = noting
    try:
        yield noted
    finally:
        compiler.get_cache_key = get_cache_key
        sidecar = Path(cache_dir) / SIDECAR
        earlier = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        sidecar.write_text(json.dumps({**earlier, **noted}, indent=0, sort_keys=True))


def _backend_hash(parts: list) -> str | None:
    """This machine's backend hash for the target an entry's backend hash names (``ptxas-version-arch``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    arch = parts[1].rsplit("-", 1)[-1]
    try:
        return make_backend(GPUTarget("cuda", int(arch), 32)).hash()
    except Exception:  # noqa: BLE001 - no CUDA backend or ptxas here: nothing can be re-keyed
        return None


def rekey(cache_dir: Path) -> str | None:
    """Move the noted entries of ``cache_dir`` made by another build of this Triton to this build's names. Returns
    a line saying what it did, or None when there is nothing to do (no notes, no Triton, all keyed for it)."""
    cache_dir = Path(cache_dir)
    sidecar = cache_dir / SIDECAR
    if not sidecar.is_file():
        return None
    try:
        key, mine = this_build()
    except ImportError:
        return None
    noted = json.loads(sidecar.read_text())
    moved, other_sources, other_backend = 0, 0, 0
    backends: dict = {}
    for folder, entry in list(noted.items()):
        old = cache_dir / folder
        if entry["build"] == mine["build"] or not old.is_dir():
            continue
        if entry["sources"] != mine["sources"]:
            other_sources += 1
            continue
        parts = entry["parts"]
        if parts[1] not in backends:
            backends[parts[1]] = _backend_hash(parts)
        if backends[parts[1]] != parts[1]:
            other_backend += 1
            continue
        new_hash = _sha256("-".join([key, *parts]))
        new = cache_dir / _folder(new_hash)
        if not new.exists():
            os.replace(old, new)
            _point_at(new, old.name, new_hash)
        else:
            import shutil

            shutil.rmtree(old)
        noted[new.name] = {**entry, **mine}
        del noted[folder]
        moved += 1
    if not (moved or other_sources or other_backend):
        return None
    sidecar.write_text(json.dumps(noted, indent=0, sort_keys=True))
    skipped = ""
    if other_sources or other_backend:
        skipped = (f"; left {other_sources} made from other Triton sources and {other_backend} by another ptxas or "
                   f"for another target")
    return f"compile cache: {moved} prewarmed Triton kernels renamed for this Triton build ({mine['build']}){skipped}"


def _point_at(folder: Path, old_name: str, new_hash: str) -> None:
    """A moved entry's group file and metadata: member paths into its new folder, its new hash."""
    for group_file in folder.glob("__grp__*.json"):
        group = json.loads(group_file.read_text())
        group["child_paths"] = {name: str(folder / Path(p).name) if Path(p).parent.name == old_name else p
                                for name, p in group.get("child_paths", {}).items()}
        group_file.write_text(json.dumps(group))
    for meta_file in folder.glob("*.json"):
        if meta_file.name.startswith("__grp__"):
            continue
        meta = json.loads(meta_file.read_text())
        if isinstance(meta, dict) and "hash" in meta:
            meta["hash"] = new_hash
            meta_file.write_text(json.dumps(meta))
