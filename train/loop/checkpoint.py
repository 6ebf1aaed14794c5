"""Model-agnostic checkpoints, written atomically and verified on load.

Layout of `<run_dir>/checkpoint/`::

    model.safetensors   the weights; a tensor tied to an earlier one (same storage, same view) is stored
                        once and its key recorded in `ties` (safetensors refuses shared storage)
    config.json         the model config (JSON object)
    trainer_state.pt    torch.save({"step", "optimizer", "scheduler", "rng", "data", "extra"}), read back
                        with `weights_only=True`, so it must hold only tensors and plain Python values
    checkpoint.json     the manifest, written last: format/format_version, step, sha256 and size of each
                        file, tensor names, ties, torch/hybrid/python versions

Atomic save: everything is written and fsynced into a fresh `checkpoint-tmp-XXXX/` beside it; then the
complete `checkpoint/` (if any) is renamed to `checkpoint.old/`, the new directory is renamed to
`checkpoint/`, and `checkpoint.old/` is renamed to `checkpoint-step-N/` (N its step) when earlier
checkpoints are kept (`keep` > 1: the newest `keep − 1` of them stay), else removed. Renames are atomic, so
`checkpoint/` is always complete when it exists, and a crash between the two renames leaves a complete
`checkpoint.old/`, which the loader falls back to only when `checkpoint/` is absent (then to the newest
`checkpoint-step-N/`), and which the next save counts among the kept checkpoints (as `checkpoint-step-N/`; one
that a crash while removing it left incomplete is removed). One process saves into a run directory at a time.

Loading checks everything before returning numbers: manifest format and version, each file's size and
sha256, config against `expected_config`, the tensor names, and that every weight is finite (a diverged
run's NaN weights are refused); any failure is a `CheckpointError` (a `ValueError`) naming the file and the
problem, and a damaged checkpoint's (a file missing, truncated, corrupt or unreadable, non-finite weights) also
names the earlier checkpoints kept beside it, to resume one of them instead. A missing checkpoint is a
`FileNotFoundError`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hybrid.checks import check_positive_int

from .rng import capture_rng_state, restore_rng_state  # re-exported: the checkpoint's RNG field

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "has_checkpoint",
    "latest_checkpoint",
    "run_dir_of",
    "kept_checkpoints",
    "nonfinite_tensors",
    "capture_rng_state",
    "restore_rng_state",
    "FORMAT_VERSION",
]

FORMAT = "hybrid-checkpoint"
FORMAT_VERSION = 1
DIR, OLD, TMP_PREFIX, KEPT_PREFIX = "checkpoint", "checkpoint.old", "checkpoint-tmp-", "checkpoint-step-"
MODEL, CONFIG, STATE, MANIFEST = "model.safetensors", "config.json", "trainer_state.pt", "checkpoint.json"
_STATE_KEYS = ("step", "optimizer", "scheduler", "rng", "data", "extra")


class CheckpointError(ValueError):
    """A checkpoint that exists but is corrupt, incomplete or incompatible."""

    def __init__(self, path: os.PathLike | str, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"checkpoint file {path}: {problem}")


class _Damaged(CheckpointError):
    """A checkpoint whose files are damaged (missing, truncated, corrupt, unreadable, non-finite weights), unlike an
    incompatible one: an earlier checkpoint of the run may be intact, so ``load_checkpoint`` names them."""


@dataclass
class Checkpoint:
    path: Path  # the checkpoint directory that was loaded
    step: int
    model_state: dict[str, torch.Tensor]  # tied keys point at the same tensor object again
    config: dict
    optimizer_state: Any
    scheduler_state: Any
    rng_state: Any
    data_state: Any
    extra: Any = None
    ties: dict[str, str] = field(default_factory=dict)  # tied key -> the key whose tensor it shares
    manifest: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------- saving


def _split_ties(model_state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU tensors that own their storage, and {tied key: kept key} for exact aliases."""
    kept: dict[str, torch.Tensor] = {}
    ties: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for key, t in model_state.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"model_state[{key!r}]: expected a Tensor, got {type(t).__name__}")
        t = t.detach()
        alias = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() > 0 and alias in seen:
            ties[key] = seen[alias]
            continue
        seen[alias] = key
        kept[key] = t
    out = {}
    for key, t in kept.items():
        t = t.to("cpu")
        if not t.is_contiguous() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone(memory_format=torch.contiguous_format)  # a view or a partial overlap: own copy
        out[key] = t
    return out, ties


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _jsonable(config: Any) -> dict:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if not isinstance(config, dict):
        raise TypeError(f"config: expected a dict or a dataclass instance, got {type(config).__name__}")
    return json.loads(json.dumps(config))  # tuples -> lists, as they will read back


def _versions() -> dict:
    try:
        from importlib.metadata import version

        hybrid_version = version("hybrid")
    except Exception:  # not installed as a distribution
        hybrid_version = "unknown"
    return {"torch": torch.__version__, "hybrid": hybrid_version, "python": platform.python_version()}


def _write_files(tmp: Path, *, tensors, ties, config, trainer_state, step) -> None:
    save_file(tensors, str(tmp / MODEL), metadata={"format": "pt", "ties": json.dumps(ties, sort_keys=True)})
    _fsync(tmp / MODEL)
    _write_text(tmp / CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n")
    torch.save(trainer_state, tmp / STATE)
    _fsync(tmp / STATE)
    files = {name: {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
             for name in (MODEL, CONFIG, STATE)}
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step, "files": files,
                "tensors": sorted(tensors), "ties": ties, "versions": _versions()}
    _write_text(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _fsync(tmp)


def save_checkpoint(
    run_dir: str | os.PathLike,
    *,
    model_state: dict[str, torch.Tensor],
    config: dict,
    optimizer_state: Any,
    scheduler_state: Any,
    rng_state: Any,
    data_state: Any,
    step: int,
    extra: Any = None,
    keep: int = 1,
) -> Path:
    """Write `<run_dir>/checkpoint/` atomically (see the module doc); returns its path. ``keep``: how many
    checkpoints stay, this one included (the others as `checkpoint-step-N/`)."""
    check_positive_int("keep", keep)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob(TMP_PREFIX + "*"):  # left by a save that crashed
        shutil.rmtree(stale, ignore_errors=True)
    tensors, ties = _split_ties(model_state)
    trainer_state = {"step": int(step), "optimizer": optimizer_state, "scheduler": scheduler_state,
                     "rng": rng_state, "data": data_state, "extra": extra}
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=run_dir))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        _write_files(tmp, tensors=tensors, ties=ties, config=_jsonable(config), trainer_state=trainer_state,
                     step=int(step))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final, old = run_dir / DIR, run_dir / OLD
    if old.exists():  # left by a save that crashed between its renames
        _settle_old(run_dir)
    if final.exists():  # complete by construction: only finished directories are renamed to it
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(run_dir)
    if old.exists() and keep > 1:
        _keep_by_step(old)
    shutil.rmtree(old, ignore_errors=True)
    for _, stale in kept_checkpoints(run_dir)[keep - 1:]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _keep_by_step(old: Path) -> None:
    """Rename the complete ``old`` to ``checkpoint-step-N/`` (N its step) beside it, among the kept checkpoints."""
    kept = old.parent / f"{KEPT_PREFIX}{_manifest_step(old)}"
    shutil.rmtree(kept, ignore_errors=True)  # the same step saved again (a resume at the last step)
    os.replace(old, kept)
    _fsync(old.parent)


def _settle_old(run_dir: Path) -> None:
    """A `checkpoint.old/` left by a crashed save: complete (the crash came between the two renames), it joins the
    kept checkpoints, so ``keep`` prunes the oldest ones and not it; incomplete (the crash came while it was being
    removed), it is removed."""
    old = run_dir / OLD
    if _complete(old):
        _keep_by_step(old)
    else:
        shutil.rmtree(old)


def _complete(ckpt: Path) -> bool:
    """Whether ``ckpt`` holds a readable manifest and every file it lists at its size (no sha256: this tells a
    checkpoint that was being removed from a whole one; loading verifies the contents)."""
    try:
        files = json.loads((ckpt / MANIFEST).read_text(encoding="utf-8"))["files"]
        return all((ckpt / name).stat().st_size == files[name]["bytes"] for name in (MODEL, CONFIG, STATE))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _manifest_step(ckpt: Path) -> int:
    try:
        return int(json.loads((ckpt / MANIFEST).read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1  # unreadable: named checkpoint-step--1, pruned first


def kept_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The earlier checkpoints kept beside `checkpoint/`, newest first: [(step, path)]."""
    found = []
    for path in Path(run_dir).glob(KEPT_PREFIX + "*"):
        try:
            found.append((int(path.name[len(KEPT_PREFIX):]), path))
        except ValueError:
            continue
    return sorted(found, key=lambda item: item[0], reverse=True)


# ------------------------------------------------------------------------------------------------ loading


def run_dir_of(path) -> Path:
    """The run directory that ``--resume path`` names: ``path``, or its parent when ``path`` is a checkpoint
    directory itself (``runs/a/checkpoint-step-6``)."""
    path = Path(path)
    return path.parent if (path / MANIFEST).is_file() else path


def _locate(run_dir: Path) -> Path:
    if (run_dir / MANIFEST).is_file():  # pointed at a checkpoint directory itself
        return run_dir
    if not run_dir.exists():
        raise FileNotFoundError(f"no checkpoint: run directory {run_dir} does not exist")
    if (run_dir / DIR).is_dir():
        return run_dir / DIR
    if (run_dir / OLD).is_dir():  # a save crashed between its two renames
        return run_dir / OLD
    kept = kept_checkpoints(run_dir)
    if kept:
        return kept[0][1]
    raise FileNotFoundError(f"no checkpoint in {run_dir} (expected {run_dir / DIR}/{MANIFEST})")


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    """Whether `load_checkpoint(run_dir)` finds a checkpoint to try (it may still be refused)."""
    try:
        _locate(Path(run_dir))
        return True
    except FileNotFoundError:
        return False


def latest_checkpoint(run_dir: str | os.PathLike) -> tuple[int, Path] | None:
    """(step, path) of the checkpoint ``load_checkpoint(run_dir)`` would try, from its manifest (no file is
    verified: for messages, e.g. which checkpoint survived an interrupted run); None when there is none or its
    manifest is unreadable."""
    try:
        path = _locate(Path(run_dir))
    except FileNotFoundError:
        return None
    step = _manifest_step(path)
    return None if step < 0 else (step, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _Damaged(path, "missing (incomplete checkpoint)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _Damaged(path, f"not valid JSON ({e})") from None


def _config_diff(expected: Any, actual: Any, where: str = "") -> list[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in sorted(set(expected) | set(actual), key=str):
            name = f"{where}.{k}" if where else str(k)
            if k not in actual:
                out.append(f"field {name!r} is missing from the checkpoint (expected {expected[k]!r})")
            elif k not in expected:
                out.append(f"field {name!r} is in the checkpoint ({actual[k]!r}) but not expected")
            else:
                out += _config_diff(expected[k], actual[k], name)
        return out
    if expected != actual or type(expected) is not type(actual) and not _both_numbers(expected, actual):
        return [f"field {where or '<root>'!r}: checkpoint has {actual!r}, expected {expected!r}"]
    return []


def _both_numbers(a, b) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))


def _verify_files(ckpt: Path, manifest: dict) -> None:
    for name in (MODEL, CONFIG, STATE):
        info = manifest.get("files", {}).get(name)
        path = ckpt / name
        if info is None:
            raise _Damaged(ckpt / MANIFEST, f"lists no entry for {name}")
        if not path.is_file():
            raise _Damaged(path, "missing (incomplete checkpoint)")
        size = path.stat().st_size
        if size != info["bytes"]:
            raise _Damaged(path, f"is {size} bytes, the manifest says {info['bytes']} (truncated or replaced)")
        if _sha256(path) != info["sha256"]:
            raise _Damaged(path, "sha256 does not match the manifest (the file is corrupt)")


def load_checkpoint(
    run_dir: str | os.PathLike,
    *,
    expected_config: dict | None = None,
    map_location: str | torch.device = "cpu",
    allow_nonfinite: bool = False,
) -> Checkpoint:
    """Load and verify the checkpoint of `run_dir` (or a checkpoint directory itself).
    ``allow_nonfinite``: load NaN / inf weights instead of refusing them (to inspect a diverged run)."""
    ckpt = _locate(Path(run_dir))
    try:
        return _load(ckpt, expected_config, map_location, allow_nonfinite)
    except _Damaged as e:
        raise CheckpointError(e.path, e.problem + _earlier(ckpt)) from None


def _earlier(ckpt: Path) -> str:
    """"; earlier checkpoints: P (step N), …: pass one instead, e.g. --resume P", naming the checkpoints kept beside
    ``ckpt`` ("" when there are none): what a run whose checkpoint is damaged can go on from."""
    earlier = [(step, path) for step, path in kept_checkpoints(ckpt.parent) if path != ckpt]
    if not earlier:
        return ""
    named = ", ".join(f"{path} (step {step})" for step, path in earlier)
    return f"; earlier checkpoints: {named}: pass one instead, e.g. --resume {earlier[0][1]}"


def _load(ckpt: Path, expected_config: dict | None, map_location, allow_nonfinite: bool) -> Checkpoint:
    """``load_checkpoint`` of the checkpoint directory ``ckpt``: a damaged one raises ``_Damaged``."""
    manifest = _read_json(ckpt / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(ckpt / MANIFEST, f"is not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(ckpt / MANIFEST, f"format_version {version!r}; this code reads version {FORMAT_VERSION}")
    _verify_files(ckpt, manifest)

    config = _read_json(ckpt / CONFIG)
    if expected_config is not None:
        diff = _config_diff(_jsonable(expected_config), config)
        if diff:
            raise CheckpointError(ckpt / CONFIG, "config does not match the expected one: " + "; ".join(diff))

    try:
        tensors = load_file(str(ckpt / MODEL), device=str(map_location))
    except (SafetensorError, OSError, RuntimeError) as e:
        raise _Damaged(ckpt / MODEL, f"unreadable safetensors ({e})") from None
    if sorted(tensors) != manifest.get("tensors"):
        missing = sorted(set(manifest.get("tensors", [])) - set(tensors))
        raise _Damaged(ckpt / MODEL, f"tensor names differ from the manifest (missing: {missing[:5]})")
    bad = nonfinite_tensors(tensors)
    if bad and not allow_nonfinite:
        raise _Damaged(ckpt / MODEL, f"holds non-finite weights (NaN or inf in {', '.join(bad[:3])}"
                                     f"{', …' if len(bad) > 3 else ''}): written by a diverged run")
    ties = manifest.get("ties", {})
    model_state = dict(tensors)
    for key, target in ties.items():
        if target not in tensors:
            raise _Damaged(ckpt / MANIFEST, f"tie {key!r} -> {target!r} names a tensor that is not stored")
        model_state[key] = tensors[target]

    try:
        state = torch.load(ckpt / STATE, map_location=map_location, weights_only=True)
    except Exception as e:  # pickle, zip and weights_only errors alike
        raise _Damaged(ckpt / STATE, f"unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise _Damaged(ckpt / STATE, f"holds a {type(state).__name__}, expected a dict")
    if set(_STATE_KEYS) - set(state):
        raise _Damaged(ckpt / STATE, f"missing keys {sorted(set(_STATE_KEYS) - set(state))}")
    if state["step"] != manifest.get("step"):
        raise _Damaged(ckpt / STATE, f"step {state['step']} differs from the manifest's {manifest.get('step')}")
    return Checkpoint(
        path=ckpt, step=int(state["step"]), model_state=model_state, config=config,
        optimizer_state=state["optimizer"], scheduler_state=state["scheduler"], rng_state=state["rng"],
        data_state=state["data"], extra=state["extra"], ties=dict(ties), manifest=manifest,
    )


def nonfinite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors holding a NaN or an inf."""
    return [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
