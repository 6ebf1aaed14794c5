"""torchrun support: the process group, DDP / FSDP2 wrapping, and full (unsharded) state dicts.

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` in the environment, ``WORLD_SIZE > 1``) the
process group is NCCL on CUDA and gloo on CPU. The model is wrapped in DDP, or with ``fsdp=True`` sharded
by FSDP2: ``fully_shard`` on every block, then on the root (which holds the embedding, the tied LM head and
the final norm).

Checkpoints hold full state dicts whatever the wrapping (``full_model_state``, ``full_optimizer_state``):
``get_model_state_dict`` / ``get_optimizer_state_dict`` with ``full_state_dict=True, cpu_offload=True`` (optimizer
state keyed by parameter name, not by position), restored with the ``set_*`` counterparts on every rank. So a run
saved on N ranks resumes on M, with or without FSDP. ``gradient_sync`` holds the gradients back on every
micro-batch of a step but the last.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .device import env_int, resolve_device  # resolve_device: also importable from here, its first home

__all__ = ["DistEnv", "resolve_device", "init_distributed", "wrap_model", "gradient_sync", "tied_names",
           "full_model_state", "model_state_everywhere", "full_optimizer_state", "load_full_model_state",
           "load_full_optimizer_state"]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class DistEnv:
    """This process's place in the job; ``world_size == 1`` without torchrun."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """In place across ranks (a no-op on one process); returns ``tensor``."""
        if self.distributed:
            dist.all_reduce(tensor, op=op)
        return tensor

    def close(self, *, finished: bool = True) -> None:
        """Leave the job. After a finished run every rank first meets at a barrier, so no rank tears down its
        sockets while a peer's last collective is still in flight (after a failure the peers may be gone, so
        there is no barrier: torchrun stops them)."""
        if self.distributed and dist.is_initialized():
            if finished:
                dist.barrier()
            dist.destroy_process_group()


def init_distributed(device: torch.device) -> DistEnv:
    """Join the torchrun job this process belongs to (if any); NCCL for CUDA devices, gloo otherwise."""
    env = DistEnv(rank=env_int("RANK", 0), world_size=env_int("WORLD_SIZE", 1),
                  local_rank=env_int("LOCAL_RANK", 0))
    if not 0 <= env.rank < env.world_size:
        raise ValueError(f"RANK: expected 0 <= RANK < WORLD_SIZE={env.world_size}, got {env.rank}")
    if env.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            dist.init_process_group(backend, device_id=device)
        else:
            dist.init_process_group(backend)
    return env


def wrap_model(model: nn.Module, env: DistEnv, *, fsdp: bool, device: torch.device, units=None) -> nn.Module:
    """The module to call in training: ``model`` itself (one process, or FSDP2 applied in place) or DDP. FSDP2 shards
    each of ``units`` (default: ``model.blocks``), then the root."""
    if not env.distributed:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        # The blocks return (hidden, state); the state holds views (e.g. the last scan state) that training
        # discards and never modifies in place, so FSDP2's warning about views does not apply.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")

        for unit in (model.blocks if units is None else units):
            fully_shard(unit)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


@contextlib.contextmanager
def gradient_sync(module: nn.Module, enabled: bool):
    """Backward passes inside synchronise the gradients across the ranks only when ``enabled`` (the last micro-batch
    of a step): DDP's ``no_sync`` otherwise, FSDP2's ``set_requires_gradient_sync``; nothing on one process.
    ``module`` is what the forward pass calls (compiled or not)."""
    module = getattr(module, "_orig_mod", module)  # torch.compile's wrapper
    module = getattr(module, "wrapped", module)  # hybrid.models.CompiledBlocks: the module it calls
    if hasattr(module, "set_requires_gradient_sync"):  # sharded by FSDP2
        module.set_requires_gradient_sync(enabled)
    if not enabled and hasattr(module, "no_sync"):  # DDP
        with module.no_sync():
            yield
    else:
        yield


def tied_names(model: nn.Module) -> dict[str, str]:
    """{name: first name} for parameters registered under more than one name (the tied LM head)."""
    first: dict[int, str] = {}
    ties = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            ties[name] = first[id(p)]
        else:
            first[id(p)] = name
    return ties


def full_model_state(model: nn.Module) -> dict:
    """The model's state, full and on the CPU: a collective under FSDP2 (complete on rank 0 only; the other ranks
    get an empty dict). Tied names share one tensor, as in an unwrapped model."""
    state = get_model_state_dict(model, options=_FULL)
    for name, target in tied_names(model).items():
        if name in state and target in state:
            state[name] = state[target]
    return state


def model_state_everywhere(model: nn.Module) -> dict:
    """The model's state, full on every rank (a collective under FSDP2: each sharded tensor is gathered, on its
    device), for a rank that builds another model from it."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    for name, target in tied_names(model).items():
        if name in state and target in state:
            state[name] = state[target]
    return state


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state keyed by parameter name (relative to ``model``), full and on the CPU (a collective
    under FSDP2). An optimizer that has not stepped yet gives torch's own (empty) state dict, as it is."""
    if not optimizer.state:
        return optimizer.state_dict()
    return get_optimizer_state_dict(model, optimizer, options=_FULL)


def load_full_model_state(model: nn.Module, state: dict) -> None:
    """Inverse of ``full_model_state``; every rank passes the full dict (each reads the checkpoint itself)."""
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of ``full_optimizer_state`` for a state keyed by name; every rank passes the full dict."""
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
