"""A decode state as a graph sees it: the tensors it holds, where they sit, and the host values beside them.

A recorded decode step (``graphed_step.py``) reads and writes fixed memory. Its state is the ``HybridState`` it
was recorded with (the *static* state); replaying the step must leave that same object holding the next state.
``StateLayout`` walks a state once (the ``HybridState``, its layer states, their caches) and keeps every place
that holds a tensor (an attribute or a list item), so that:

- ``tensors(state)`` lists a state's tensors in the layout's order (one entry per distinct tensor: the same tensor
  held twice, an attention state's ``length`` and its cache's ``lengths``, is one entry);
- ``put_back(state, tensors)`` points the places back at the given tensors (a step assigns new ones to its cache
  objects as it runs);
- ``key`` says which states one recorded graph can serve: the tensors' shapes, dtypes and devices, how they are
  shared, and the host values (a window, a flag). ``span``, the host bound on a global cache's lengths, is a
  counter, not part of the key: a recorded step advances it by one.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from hybrid.attention_state import AttentionState, is_rows

_HOST_VALUES = (int, float, bool, str, type(None))
COUNTERS = ("span",)  # host counters a step advances: copied in, kept out of the key


def _attributes(obj) -> list[tuple[object, object]]:
    """The (key, value) pairs under ``obj``: a list's items, a dataclass's fields, an object's attributes."""
    if isinstance(obj, list):
        return list(enumerate(obj))
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return list(vars(obj).items())


def _set(owner, key, value) -> None:
    if isinstance(owner, list):
        owner[key] = value
    else:
        object.__setattr__(owner, key, value)  # frozen dataclasses too


class StateLayout:
    """Where a state's tensors and host values sit (see the module docstring)."""

    def __init__(self, state):
        self.places: list[tuple[object, object, int]] = []  # (owner, key, index into tensors)
        self.counters: list[tuple[object, str]] = []  # (owner, name) of each host counter
        self.tensors: list[Tensor] = []
        key: list = []
        index_of: dict[int, int] = {}
        seen: set[int] = set()

        def walk(obj, path: str) -> None:
            if id(obj) in seen:
                key.append((path, "again"))
                return
            seen.add(id(obj))
            key.append((path, type(obj).__name__))
            for name, value in _attributes(obj):
                where = f"{path}.{name}"
                if isinstance(value, Tensor):
                    if id(value) not in index_of:
                        index_of[id(value)] = len(self.tensors)
                        self.tensors.append(value)
                    i = index_of[id(value)]
                    self.places.append((obj, name, i))
                    key.append((where, i, tuple(value.shape), value.dtype, value.device.type))
                elif name in COUNTERS and isinstance(value, int):
                    self.counters.append((obj, name))
                elif isinstance(value, _HOST_VALUES):
                    key.append((where, value))
                elif isinstance(value, (list,)) or dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
                    walk(value, where)
                else:
                    raise ValueError(f"state: expected tensors, host numbers and state objects, got "
                                     f"{type(value).__name__} at {where}")

        walk(state, "state")
        self.key = tuple(key)

    def put_back(self, tensors: list[Tensor]) -> None:
        """Point every place of the laid-out state at ``tensors`` (in this layout's order)."""
        for owner, name, i in self.places:
            _set(owner, name, tensors[i])

    def read_counters(self) -> list[int]:
        return [getattr(owner, name) for owner, name in self.counters]

    def write_counters(self, values: list[int]) -> None:
        for (owner, name), value in zip(self.counters, values):
            setattr(owner, name, value)


def same_memory(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` are views of the same bytes (a copy between them would change nothing)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def _global_rows(state) -> list:
    """The attention layer states of ``state`` whose cache is a global rows cache (``RowKVCache``, no window)."""
    return [layer for layer in state.layers
            if isinstance(layer, AttentionState) and is_rows(layer) and layer.cache.window is None]


def fix_caches(state, capacity: int) -> None:
    """Every global rows cache of ``state`` attends over ``capacity`` slots from now on (``RowKVCache.fix``), and
    its attention state's ``k`` / ``v`` are the cache's buffers themselves."""
    for layer in _global_rows(state):
        layer.cache.fix(capacity)
        layer.k, layer.v = layer.cache.keys, layer.cache.values


def bound_global_spans(state, span: int) -> None:
    """Every global rows cache of ``state`` takes ``span`` as the bound on its lengths: the longest row, which the
    caller knows on the host (continuous batching counts each row's prompt and tokens since). A cache's span only
    grows otherwise, by every step's tokens, whichever rows they went to: a long stream of short requests would
    attend over ever more slots, and its graphs record again at ever larger capacities."""
    for layer in _global_rows(state):
        layer.cache.span = span
        layer.k, layer.v = layer.cache.keys, layer.cache.values


def global_spans(state) -> list[int]:
    """The span (host bound on the lengths) of each global rows cache of ``state``."""
    return [layer.cache.span for layer in _global_rows(state)]


def global_capacity(state) -> int | None:
    """The slots of the global rows caches of ``state`` (one capacity for all), None without one."""
    sizes = {layer.cache.k.shape[1] for layer in _global_rows(state)}
    return max(sizes) if sizes else None


def is_rows_state(state) -> bool:
    """Every attention layer of ``state`` (a ragged ``HybridState``) is in the rows form with its entries."""
    return state.ragged and all(is_rows(layer) for layer in state.layers if isinstance(layer, AttentionState))


def copy_into(static: list[Tensor], given: list[Tensor]) -> None:
    with torch.no_grad():
        for s, g in zip(static, given):
            if not same_memory(s, g):
                s.copy_(g)
