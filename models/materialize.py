"""Initialising a model built on the meta device: every submodule's ``reset_parameters`` in the constructor's order.

A constructor draws each submodule's parameters at the end of that submodule's own ``__init__``, after its children
were built: children before their parent, in the order they were made. ``reset_in_build_order`` calls
``reset_parameters`` in that order (the module tree in post-order), so under the same seed the random draws repeat
the constructor's, value for value on one device.
"""
from __future__ import annotations

import contextlib

from torch import nn


def post_order(module: nn.Module):
    """``module``'s submodules, each once, children before their parent, the root last."""
    seen: set[int] = set()

    def visit(m: nn.Module):
        if id(m) in seen:
            return
        seen.add(id(m))
        for child in m.children():
            yield from visit(child)
        yield m

    yield from visit(module)


def reset_in_build_order(model: nn.Module) -> None:
    """``reset_parameters()`` of every submodule of ``model`` that has one (the root's excepted), children first."""
    for module in post_order(model):
        if module is not model and callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()


def sharded_parameters_take_plain_tensors():
    """A context in which a sharded (DTensor) parameter takes a plain tensor as replicated: ``p.copy_(values)``
    in a ``reset_parameters`` writes each rank's shard of ``values``. Without ``torch.distributed``: nothing."""
    try:
        from torch.distributed.tensor.experimental import implicit_replication
    except ImportError:  # a torch built without distributed
        return contextlib.nullcontext()
    return implicit_replication()


def check_sharded_draws(model: nn.Module) -> None:
    """Refuse, in one line, random draws into parameters sharded over a CPU mesh: DTensor's random ops give each
    rank distinct shards only on an accelerator (its offset-based generator); on a CPU mesh every rank would draw
    the same values into its own shard, repeating one block across the tensor."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) and p.device_mesh.device_type == "cpu" and p.device_mesh.size() > 1:
            raise ValueError(f"model: expected parameters sharded over an accelerator's mesh to draw them in place "
                             f"(a CPU mesh repeats one rank's draws in every shard), got {name} sharded over "
                             f"{p.device_mesh.size()} CPU ranks; initialise before sharding, or load a state dict")
