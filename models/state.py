"""The model-level decode state: one state per layer plus the number of tokens seen, kept here once."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hybrid.batch_state import check_keep, check_rows
from hybrid.mixer import MixerState


@dataclass
class HybridState:
    """Per-layer mixer states, in layer order, and the tokens seen.

    ``offset`` (the tokens seen: the position of the next token) is the one record of the position: layer states
    hold none, and the model passes ``offset`` to every mixer's ``forward`` / ``step``. It is an int when every row
    is at one position, or an int64 tensor ``(B,)`` of per-row positions: a ragged batch, whose rows started at
    different times (prompts of different lengths, requests that joined a running batch). Every mode continues
    either; ``cat`` of states at different positions gives the second.

    Passing it back to ``HybridLM.forward`` / ``step`` continues the sequence in any mode: processing ``a`` and
    then ``b`` from the returned state equals processing ``a ++ b``.

    Reuse: under autograd (training) nothing is modified in place. Without it (decoding, ``generate``), the
    attention caches are written in place, so a state is consumed by the call that continues it: R and M states
    are always replaced, never written, and a global KV cache copies on write, but a sliding-window ring (and any
    cache of a ragged batch) is overwritten, and continuing an older such state raises a ``ValueError``. To
    continue one state several times (e.g. to branch continuations from one prompt), ``clone()`` it first, once
    per extra branch; to go back after continuing it (speculative decoding), take ``fork()`` first and
    ``rewind`` to it.

    Rows (the batch axis is the decode slot, docs/decoding.md): ``select`` takes rows, ``put`` writes a state into
    rows (a finished request's slot takes the next one), ``cat`` joins states at any positions.
    """

    layers: list[MixerState] = field(default_factory=list)
    offset: int | Tensor = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the state's tensors: fixed for R/M layers and windowed attention, growing with
        global attention."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def ragged(self) -> bool:
        """The rows are at their own positions (``offset`` is a tensor)."""
        return isinstance(self.offset, Tensor)

    @property
    def batch_size(self) -> int:
        """Rows of the batch, read off the positions or the first layer state holding a tensor."""
        if self.ragged:
            return self.offset.shape[0]
        rows, _ = _rows_and_device(self.layers)
        if rows is None:
            raise ValueError("state: expected a state holding a tensor or per-row positions, got one holding "
                             "neither (no tokens seen); build it with init_state(batch_size)")
        return rows

    def positions(self) -> Tensor:
        """Each row's position, int64 ``(B,)`` (the tensor ``offset``, or the int repeated)."""
        if self.ragged:
            return self.offset
        _, device = _rows_and_device(self.layers)
        return torch.full((self.batch_size,), self.offset, dtype=torch.long, device=device)

    def clone(self) -> "HybridState":
        """A state that continues independently of this one: each layer's ``clone()`` (attention caches
        copied; R and M states are never written in place, so they clone to themselves)."""
        layers = [None if layer is None else layer.clone() for layer in self.layers]
        return HybridState(layers=layers, offset=self.offset.clone() if self.ragged else self.offset)

    @classmethod
    def cat(cls, states: list["HybridState"]) -> "HybridState":
        """The states of several sequences as one batch (rows in order), e.g. the per-sequence states of a packed
        forward (``HybridLM.forward(..., cu_seqlens=...)``). States at one position keep an int ``offset``; at
        different ones the batch is ragged (per-row positions)."""
        if not states:
            raise ValueError("states: expected a non-empty list of HybridStates, got an empty list")
        if any(not isinstance(s, HybridState) or len(s.layers) != len(states[0].layers) for s in states):
            raise ValueError("states: expected HybridStates of one model (as many layer states each), got "
                             f"{[len(s.layers) if isinstance(s, HybridState) else type(s).__name__ for s in states]}")
        if all(not s.ragged and s.offset == states[0].offset for s in states):
            offset = states[0].offset
        else:
            offset = torch.cat([s.positions() for s in states])
        layers = [_op(layer, "cat")([s.layers[i] for s in states]) for i, layer in enumerate(states[0].layers)]
        if isinstance(offset, Tensor):
            offset = offset.to(_rows_and_device(layers)[1] or offset.device)
        return cls(layers=layers, offset=offset)

    def ragged_copy(self) -> "HybridState":
        """This state with per-row positions (its layers shared): the form speculative decoding and continuous
        batching continue, whatever positions the rows are at."""
        return HybridState(layers=list(self.layers), offset=self.positions())

    def select(self, index: Tensor) -> "HybridState":
        """Rows ``index`` ``(n,)`` as a new state (copied)."""
        index = check_rows("index", index, self.batch_size)
        offset = self.offset.index_select(0, index.to(self.offset.device)) if self.ragged else self.offset
        return HybridState(layers=[_op(layer, "select")(index) for layer in self.layers], offset=offset)

    def put(self, rows: Tensor, source: "HybridState") -> "HybridState":
        """This batch with rows ``rows`` ``(n,)`` replaced by ``source``'s n rows (their states written into the
        rows' slots, in place for attention caches); the result has per-row positions. This state is consumed."""
        rows = check_rows("rows", rows, self.batch_size)
        if not isinstance(source, HybridState) or len(source.layers) != len(self.layers):
            raise ValueError(f"source: expected a HybridState of {len(self.layers)} layer states, got "
                             f"{type(source).__name__}")
        positions = self.positions()
        offset = positions.index_copy(0, rows.to(positions.device), source.positions().to(positions.device))
        layers = [_op(layer, "put")(rows, src) for layer, src in zip(self.layers, source.layers)]
        return HybridState(layers=layers, offset=offset)

    def fork(self) -> "HybridState":
        """A rollback point: continue this state, then ``rewind(keep, fork)`` takes rows back to here. Costs
        nothing for R and M layers and a global cache (truncated on rewind); copies a window's ring."""
        return HybridState(layers=[_op(layer, "fork")() for layer in self.layers], offset=self.offset)

    def rewind(self, keep: Tensor, fork: "HybridState") -> "HybridState":
        """Rows where ``keep`` ``(B,)`` is False taken back to ``fork`` (this state's ancestor's ``fork()``), the
        others kept: each row exactly as if it had seen only its kept tokens."""
        keep = check_keep(keep, self.batch_size)
        if not self.ragged and not fork.ragged and self.offset == fork.offset:
            offset = self.offset
        else:
            here, there = self.positions(), fork.positions()
            offset = torch.where(keep.to(here.device), here, there.to(here.device))
        layers = [_op(layer, "rewind")(keep, old) for layer, old in zip(self.layers, fork.layers)]
        return HybridState(layers=layers, offset=offset)


def _op(layer, name: str):
    """The layer state's row operation ``name`` (``hybrid.mixer``'s state API), or a one-line error naming it."""
    op = getattr(layer, name, None)
    if op is None:
        raise ValueError(f"state: expected layer states with {name}() (hybrid.mixer's decode-state API: inherit "
                         f"hybrid.batch_state.TensorState for batch-first tensors never written in place), got a "
                         f"{type(layer).__name__} without it")
    return op


def _rows_and_device(layers) -> tuple[int | None, torch.device | None]:
    """The rows of the first layer state holding a tensor (or recording its batch size) and that tensor's device."""
    for layer in layers:
        if layer is None:
            continue
        if dataclasses.is_dataclass(layer):
            values = [getattr(layer, f.name) for f in dataclasses.fields(layer)]
        else:
            values = list(vars(layer).values())
        for value in values:
            if isinstance(value, Tensor):
                return value.shape[0], value.device
        if isinstance(getattr(layer, "batch", None), int):
            return layer.batch, None
    return None, None
