"""HybridCache: a transformers ``Cache`` that holds our ``HybridState`` (recurrent states, ring buffers, KV caches).

Rows of a batch live in *streams*: a stream is a set of rows that have seen the same real tokens count, with
one batched ``HybridState`` for them. An unpadded batch is one stream. A padded batch (``attention_mask``
with zeros) splits into one stream per distinct mask pattern, and each stream sees only its real tokens:
pads never enter a recurrent state or a key cache, and every row starts at position 0, so left padding gives
exactly the logits of the unpadded rows, for every mixer and rotary placement.

Beam search reorders rows (``reorder_cache``), contrastive search repeats and selects them
(``batch_repeat_interleave``, ``batch_select_indices``): each is a gather along the batch axis of every tensor
of the states (all state tensors are batch-first).
"""
from __future__ import annotations

import copy

import torch
from transformers.cache_utils import Cache

from hybrid.models import HybridState

from .compat import CACHE_INIT_TAKES_LAYERS


def map_state_tensors(state, fn):
    """A copy of ``state`` (any nesting of dataclasses, objects, lists, dicts) with every tensor ``t``
    replaced by ``fn(t)``; objects reachable twice stay shared in the copy."""
    memo: dict[int, object] = {}

    def walk(obj):
        if id(obj) in memo:
            return memo[id(obj)]
        if isinstance(obj, torch.Tensor):
            out = fn(obj)
        elif isinstance(obj, (list, tuple)):
            out = type(obj)(walk(v) for v in obj)
        elif isinstance(obj, dict):
            out = {k: walk(v) for k, v in obj.items()}
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            out = copy.copy(obj)
            for key, value in vars(obj).items():
                object.__setattr__(out, key, walk(value))
        else:
            out = obj
        memo[id(obj)] = out
        return out

    return walk(state)


def select_rows(state: HybridState, index: torch.Tensor) -> HybridState:
    """The state of rows ``index`` ``(n,)`` (a gather along the batch axis of every state tensor)."""
    return map_state_tensors(state, lambda t: t.index_select(0, index.to(t.device)))


class HybridCache(Cache):
    """Decode state of ``HybridForCausalLM``: streams of rows, each with one ``HybridState``.

    ``columns``: input columns consumed so far (pads included), what ``get_seq_length`` reports.
    ``streams``: list of ``(rows (n,) int64, HybridState or None)``; the rows of all streams partition the batch.
    """

    is_compileable = False

    def __init__(self):
        if CACHE_INIT_TAKES_LAYERS:
            super().__init__(layers=[])
        else:  # pragma: no cover - transformers releases whose Cache.__init__ takes no layers
            super().__init__()
        self.columns = 0
        self.streams: list[tuple[torch.Tensor, HybridState | None]] = []

    # ------------------------------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return 0 if not self.streams else len(next(s for _, s in self.streams if s is not None).layers)

    @property
    def batch_size(self) -> int:
        return int(sum(rows.numel() for rows, _ in self.streams)) if self.streams else -1

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return self.columns

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.columns + query_length, 0

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return bool(self.streams)

    @property
    def nbytes(self) -> int:
        """Bytes held by the states of all streams."""
        return sum(state.nbytes for _, state in self.streams if state is not None)

    # ------------------------------------------------------------------------------------------ updates

    def reset(self) -> None:
        self.columns = 0
        self.streams = []

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("HybridCache: recurrent states cannot be cropped (assisted decoding is unsupported)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row ``i`` becomes old row ``beam_idx[i]`` (beam search)."""
        self._gather(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._gather(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._gather(torch.arange(self.batch_size).repeat_interleave(repeats))

    def _gather(self, source: torch.Tensor) -> None:
        """Rebuild the batch so that new row ``i`` is old row ``source[i]``."""
        if not self.streams:
            return
        source = source.reshape(-1).cpu()
        n_old = self.batch_size
        stream_of = torch.empty(n_old, dtype=torch.long)
        local_of = torch.empty(n_old, dtype=torch.long)
        for s, (rows, _) in enumerate(self.streams):
            stream_of[rows.cpu()] = s
            local_of[rows.cpu()] = torch.arange(rows.numel())
        new_streams = []
        for s, (_, state) in enumerate(self.streams):
            new_rows = (stream_of[source] == s).nonzero().flatten()  # (n,)
            if new_rows.numel() == 0:
                continue
            local = local_of[source[new_rows]]
            identity = local.numel() == self.streams[s][0].numel() and bool((local == torch.arange(local.numel())).all())
            new_streams.append((new_rows, state if identity or state is None else select_rows(state, local)))
        self.streams = new_streams
