"""What may change when a run is resumed, and how the batch layout follows a new number of ranks.

A resumed run is the saved ``TrainConfig`` with overrides. Fields that define the model, the data order
and the optimisation (``FIXED``) must keep their saved values; the others may change: ``steps`` (the new
total), evaluation / logging / checkpoint intervals, device, compile, fsdp, and the batch layout.

The batch layout keeps the saved global batch ``G = batch_size × grad_accum × world_size`` when it can, so
the run continues with the same sequences per optimizer step: with neither ``batch_size`` nor
``grad_accum`` given, ``grad_accum`` becomes ``G / (batch_size × world_size)``, else ``batch_size`` becomes
``G / world_size`` with ``grad_accum = 1``; with one of them given, the other is derived the same way.
When no layout reproduces ``G``, the run goes on with the new global batch (``hybrid.train.sharding`` explains
where the data continues) and a note says so. ``model`` overrides merge into the saved ``model`` dict,
so repeating a saved value is no change.
"""
from __future__ import annotations

from .config import TrainConfig

__all__ = ["FIXED", "resume_config"]

FIXED = ("preset", "size", "model", "data", "tokenizer", "valid_fraction", "seq_len", "seed", "lr",
         "min_lr_ratio", "warmup", "weight_decay", "betas", "grad_clip")


def _layout(global_batch: int, world_size: int, batch_size: int | None, grad_accum: int | None,
            saved: TrainConfig) -> tuple[int, int]:
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


def resume_config(saved: TrainConfig, *, saved_global_batch: int, world_size: int, out: str,
                  **overrides) -> tuple[TrainConfig, list[str]]:
    """(the config to resume with, notes for the user). ``overrides`` holds only what the user asked to
    change (``batch_size`` / ``grad_accum`` None = derive); a change to a FIXED field is a ValueError."""
    for name in FIXED:
        if name in overrides:
            new, old = overrides.pop(name), getattr(saved, name)
            if name == "betas":
                new = tuple(new)
            elif name == "model":  # overrides of single model fields merge into the saved ones
                new = {**old, **new}
            if new != old:
                raise ValueError(
                    f"{name}: cannot change when resuming (the checkpoint was trained with {old!r}, got {new!r}); "
                    f"start a new run with --out for a different {name}"
                )
    b, a = _layout(saved_global_batch, world_size, overrides.pop("batch_size", None),
                   overrides.pop("grad_accum", None), saved)
    config = saved.replace(out=out, batch_size=b, grad_accum=a, **overrides)
    notes = []
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
