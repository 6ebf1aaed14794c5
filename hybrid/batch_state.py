"""`TensorState`: the decode-state API (`hybrid.mixer.MixerState`) for a state made of batch-first tensors.

A mixer whose state is a dataclass of tensors `(B, …)` (one row per sequence: R's conv tail and scan state,
M's retention matrix, any matrix-state mixer) and that never writes them in place (each call returns new
tensors) inherits every row operation from here:

    state.select(index)        rows `index` (n,)                        index_select on every field
    State.cat(states)          rows of several states, in order          torch.cat on every field
    state.put(rows, source)    rows `rows` replaced by source's rows     index_copy (out of place) on every field
    state.fork()               the state itself (it is never written)
    state.rewind(keep, fork)   rows where keep is False from `fork`      torch.where on every field
    state.clone()              the state itself (it is never written)

Such a state holds no position (the caller keeps it), so states at any positions join and split alike.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .checks import reads_back


def _fields(state) -> list[tuple[str, Tensor]]:
    return [(f.name, getattr(state, f.name)) for f in dataclasses.fields(state)]


def check_rows(name: str, rows: Tensor, batch: int | None = None) -> Tensor:
    """`rows`: a 1-D integer tensor of row indices (checked against `batch` where that reads no value back:
    ``reads_back``); returned as int64."""
    if not isinstance(rows, Tensor) or rows.dim() != 1 or rows.dtype not in (torch.int64, torch.int32):
        got = (f"shape {tuple(rows.shape)} ({str(rows.dtype).removeprefix('torch.')})" if isinstance(rows, Tensor)
               else type(rows).__name__)
        raise ValueError(f"{name}: expected a 1-D int64 tensor of row indices, got {got}")
    if batch is not None and reads_back(rows) and rows.numel() and not (
            0 <= int(rows.min()) and int(rows.max()) < batch):
        raise ValueError(f"{name}: expected row indices in [0, {batch}), got {rows.tolist()}")
    return rows.long()


def check_keep(keep: Tensor, batch: int) -> Tensor:
    """`keep`: a BoolTensor `(batch,)`."""
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool or tuple(keep.shape) != (batch,):
        got = (f"{str(keep.dtype).removeprefix('torch.')} of shape {tuple(keep.shape)}" if isinstance(keep, Tensor)
               else type(keep).__name__)
        raise ValueError(f"keep: expected a bool tensor of shape ({batch},), got {got}")
    return keep


class TensorState:
    """Mixin for a `@dataclass` state whose fields are batch-first tensors, never written in place."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in _fields(self))

    @property
    def batch_size(self) -> int:
        return _fields(self)[0][1].shape[0]

    def clone(self):
        """The state itself: it is never written in place, so continuing it twice is safe."""
        return self

    @classmethod
    def cat(cls, states: list):
        """The states of several sequences as one batch (rows in order), at any positions."""
        return cls(**{name: torch.cat([getattr(s, name) for s in states]) for name, _ in _fields(states[0])})

    def select(self, index: Tensor):
        """Rows `index` `(n,)` as a new state."""
        index = check_rows("index", index, self.batch_size)
        return type(self)(**{name: t.index_select(0, index.to(t.device)) for name, t in _fields(self)})

    def put(self, rows: Tensor, source):
        """This batch with rows `rows` `(n,)` replaced by the n rows of `source` (out of place)."""
        rows = check_rows("rows", rows, self.batch_size)
        if not isinstance(source, type(self)) or source.batch_size != rows.numel():
            got = type(source).__name__ if not isinstance(source, type(self)) else f"{source.batch_size} rows"
            raise ValueError(f"source: expected a {type(self).__name__} of {rows.numel()} rows, got {got}")
        return type(self)(**{name: t.index_copy(0, rows.to(t.device), getattr(source, name).to(t.dtype))
                             for name, t in _fields(self)})

    def fork(self):
        """A rollback point: the state itself (never written in place)."""
        return self

    def rewind(self, keep: Tensor, fork):
        """Rows where `keep` `(B,)` is False taken from `fork` (the state `fork()` returned), the others from this
        state."""
        keep = check_keep(keep, self.batch_size)
        out = {}
        for name, t in _fields(self):
            where = keep.to(t.device).view(-1, *[1] * (t.dim() - 1))  # (B, 1, …)
            out[name] = torch.where(where, t, getattr(fork, name))
        return type(self)(**out)
