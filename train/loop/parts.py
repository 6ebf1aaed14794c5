"""A checkpoint's state as named parts, each a ``Stateful`` (torchtitan's idea): ``state_dict()`` to save it,
``load_state_dict(state)`` to restore it. The loop collects a run's parts by name; no file keys them by hand.

    parts = {"model": ModelPart(model), "optimizer": OptimizerPart(model, optimizer), "scheduler": scheduler,
             "data": batches, "rng": RNGPart(), "tokenizer": Record(tokenizer.to_dict())}
    save_parts(run_dir, parts, step=7, model_config=config.to_dict(), keep=2, env=env)
    load_parts(load_checkpoint(run_dir), parts)

Where each part lands (``hybrid.train.loop.checkpoint`` keeps the files): ``model`` is ``model.safetensors``;
``optimizer``, ``scheduler``, ``data`` and ``rng`` are the fields of the same names in ``trainer_state.pt``;
every other part is stored under its name in that file's ``extra``. So checkpoints written before the parts existed
(their ``extra`` held the same names: ``train_config``, ``tokenizer``, ``distill``, ``task`` …) load into them.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
from torch import nn

from ..parallel.distributed import (DistEnv, full_model_state, full_optimizer_state, load_full_model_state,
                                    load_full_optimizer_state)
from .checkpoint import Checkpoint, CheckpointError, save_checkpoint
from .rng import capture_rng_state, restore_rng_state

__all__ = ["Stateful", "ModelPart", "OptimizerPart", "RNGPart", "Record", "save_parts", "load_parts", "FIELDS"]

FIELDS = ("optimizer", "scheduler", "data", "rng")  # the parts that are trainer_state.pt's own fields


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class ModelPart:
    """The weights, full (unsharded) and on the CPU whatever wraps the model: a collective under FSDP."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        return full_model_state(self.model)

    def load_state_dict(self, state: dict) -> None:
        load_full_model_state(self.model, state)


class OptimizerPart:
    """The optimizer state keyed by parameter name (relative to ``model``), so a run resumes on any number of
    ranks, wrapped or not. A state keyed by position (``hybrid-distill`` saved it so before the one loop) loads as
    torch's own ``Optimizer.load_state_dict`` reads it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return full_optimizer_state(self.model, self.optimizer)

    def load_state_dict(self, state: dict) -> None:
        groups = state.get("param_groups", []) if isinstance(state, dict) else []
        if any(isinstance(p, int) for g in groups for p in g.get("params", [])):
            self.optimizer.load_state_dict(state)
        else:
            load_full_optimizer_state(self.model, self.optimizer, state)


class RNGPart:
    """Python's, numpy's, torch's and (when initialised) CUDA's generator states."""

    def state_dict(self) -> dict:
        return capture_rng_state()

    def load_state_dict(self, state: dict) -> None:
        restore_rng_state(state)


class Record:
    """A value the checkpoint carries for readers (the run's config, its tokenizer, a stage record): ``value`` or,
    when callable, what it returns at save time. Loading it changes nothing: a run reads its records from the
    checkpoint before it is built (so a checkpoint written before a record existed loads too)."""

    optional = True

    def __init__(self, value: Any):
        self.value = value

    def state_dict(self) -> Any:
        return self.value() if callable(self.value) else self.value

    def load_state_dict(self, state: Any) -> None:
        pass


def save_parts(run_dir, parts: dict[str, Stateful], *, step: int, model_config: dict, keep: int,
               env: DistEnv) -> None:
    """Every part's state (on every rank: the model's and optimizer's are collectives under FSDP), written by rank 0
    as one checkpoint (``save_checkpoint``: atomic, ``keep`` kept)."""
    states = {name: part.state_dict() for name, part in parts.items()}
    if env.is_main:
        fields = {name: states.pop(name, None) for name in FIELDS}
        save_checkpoint(run_dir, model_state=states.pop("model"), config=model_config,
                        optimizer_state=fields["optimizer"], scheduler_state=fields["scheduler"],
                        rng_state=fields["rng"], data_state=fields["data"], step=step, extra=states, keep=keep)


def load_parts(ckpt: Checkpoint, parts: dict[str, Stateful], *, optional: tuple[str, ...] = (),
               what: Callable[[str], str] = lambda name: f"this run's {name}") -> None:
    """Each part's state back from ``ckpt``, in the order of ``parts`` (the optimizer before the scheduler, which
    holds its learning rates). A part missing from the checkpoint is a CheckpointError unless ``optional``; a state
    that does not fit its part is one too, naming the part."""
    extra = ckpt.extra if isinstance(ckpt.extra, dict) else {}
    saved = {"model": ckpt.model_state, "optimizer": ckpt.optimizer_state, "scheduler": ckpt.scheduler_state,
             "data": ckpt.data_state, "rng": ckpt.rng_state, **extra}
    for name, part in parts.items():
        if saved.get(name) is None:
            if name in optional or getattr(part, "optional", False):
                continue
            raise CheckpointError(ckpt.path, f"holds no {name} state, so it cannot be resumed (it was not saved "
                                             f"by a resumable run)")
        try:
            part.load_state_dict(saved[name])
        except (KeyError, RuntimeError, ValueError, TypeError) as e:
            if isinstance(e, CheckpointError):
                raise
            problem = f"does not fit {what(name)} ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            raise CheckpointError(ckpt.path, problem) from None
