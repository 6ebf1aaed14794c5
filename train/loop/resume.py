"""What may change when a run is resumed, and how the batch layout follows a new number of ranks: the same rules
for every run kind.

A resumed run is its saved config (a ``RunConfig``) with overrides. Fields that define the run (the kind's
``FIXED``: the model, the data order, the optimiser's form, the run it started from; a distillation's teacher and
student too) must keep their saved values, and a flag that names one with another value is refused in one line;
the others (the kind's ``CHANGEABLE``: every field is one or the other, or ``out``) may change: ``steps`` (the new
total), the optimiser hyper-parameters the kind names (``OPTIMISER``: a language model's lr, warmup, weight decay,
gradient clipping; a note names each change, e.g. to recover from a divergence), evaluation / logging / checkpoint
intervals, the non-finite policy, the trackers, device, compile, fsdp, and the batch layout. A warmup that was never set (None) stays derived, so it follows the new ``steps``.

The batch layout keeps the saved global batch ``G = batch_size × grad_accum × world_size`` when it can, so
the run continues with the same sequences per optimizer step: with neither ``batch_size`` nor
``grad_accum`` given, ``grad_accum`` becomes ``G / (batch_size × world_size)``, else ``batch_size`` becomes
``G / world_size`` with ``grad_accum = 1``; with one of them given, the other is derived the same way.
When no layout reproduces ``G``, the run goes on with the new global batch (``hybrid.train.parallel.sharding`` explains
where the data continues) and a note says so. ``model`` overrides merge into the saved ``model`` dict
one field at a time, whatever the spelling (``hybrid.models.config_overrides``), so repeating a saved value is no
change.
"""
from __future__ import annotations

import os
from pathlib import Path

from hybrid.models.config_overrides import merge_model, same_model

__all__ = ["resume_config"]


def _layout(global_batch: int, world_size: int, batch_size: int | None, grad_accum: int | None,
            saved) -> tuple[int, int]:
    if batch_size is not None and grad_accum is not None:
        return batch_size, grad_accum
    if grad_accum is None:
        b = saved.batch_size if batch_size is None else batch_size
        if global_batch % (b * world_size) == 0:
            return b, global_batch // (b * world_size)
        if batch_size is None and global_batch % world_size == 0:
            return global_batch // world_size, 1
        return b, saved.grad_accum
    if global_batch % (grad_accum * world_size) == 0:
        return global_batch // (grad_accum * world_size), grad_accum
    return saved.batch_size, grad_accum


def resume_config(saved, *, saved_global_batch: int, world_size: int, out: str, **overrides) -> tuple:
    """(the config to resume with, notes for the user). ``overrides`` holds only what the user asked to
    change (``batch_size`` / ``grad_accum`` None = derive); a change to a field of ``saved.FIXED`` is a ValueError."""
    for name in saved.FIXED:
        if name in overrides:
            new, old = overrides.pop(name), getattr(saved, name)
            if name == "betas":
                new = tuple(new)
            elif name == "model":  # overrides of single model fields merge into the saved ones, in any spelling
                new = merge_model(old, new)
            if not (same_model(new, old) if name == "model" else new == old or _same_path(new, old)):
                raise ValueError(
                    f"{name}: cannot change when resuming (the checkpoint was trained with {old!r}, got {new!r}); "
                    f"start a new run with --out for a different {name}"
                )
    b, a = _layout(saved_global_batch, world_size, overrides.pop("batch_size", None),
                   overrides.pop("grad_accum", None), saved)
    if overrides.get("grad_clip") == 0:
        overrides["grad_clip"] = None  # 0 = no clipping, as in a fresh run
    config = saved.replace(out=out, batch_size=b, grad_accum=a, **overrides)
    notes = []
    value = lambda c, name: c.warmup_steps if name == "warmup" else getattr(c, name)  # noqa: E731
    changed = [f"{name} {_show(value(saved, name))} -> {_show(value(config, name))}" for name in saved.OPTIMISER
               if name in overrides and value(config, name) != value(saved, name)]
    if ("warmup" in saved.OPTIMISER and saved.warmup is None and config.warmup is None
            and saved.warmup_steps != config.warmup_steps):
        changed.append(f"warmup {saved.warmup_steps} -> {config.warmup_steps} (derived: min(100, steps / 10))")
    if changed:
        notes.append("optimiser changes on resume: " + ", ".join(changed))
    if b * a * world_size != saved_global_batch:
        notes.append(
            f"global batch changes from {saved_global_batch} to {b * a * world_size} sequences per step "
            f"(batch_size {b} × grad_accum {a} × {world_size} ranks); the losses will not match an "
            f"uninterrupted run"
        )
    elif (b, a) != (saved.batch_size, saved.grad_accum):
        notes.append(f"batch layout: batch_size {b} × grad_accum {a} × {world_size} ranks keeps the global "
                     f"batch of {saved_global_batch}")
    return config, notes


def _same_path(new, old) -> bool:
    """Two spellings of one existing local path (a run recorded ``--data corpus``, a resume names it absolute)."""
    if not (isinstance(new, str) and isinstance(old, str)):
        return False
    new, old = Path(new).expanduser(), Path(old).expanduser()
    return new.exists() and old.exists() and os.path.samefile(new, old)


def _show(value) -> str:
    return "off" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
