"""HybridCache: a transformers ``Cache`` that holds our ``HybridState`` (recurrent states, ring buffers, KV caches).

One ``HybridState`` holds every row of the batch. A padded batch (``attention_mask`` with zeros) prefills as one
packed forward over the real tokens, each row from position 0, and its rows join as a ragged batch
(``HybridState.cat``: every row at its own position, ``models/decoding``): pads never enter a recurrent state or a
key cache, so left padding gives exactly the logits of the unpadded rows, for every mixer and rotary placement,
and every new token is one forward for the whole batch.

Beam search reorders rows (``reorder_cache``), contrastive search repeats and selects them
(``batch_repeat_interleave``, ``batch_select_indices``): each is ``HybridState.select``, a gather along the batch
axis of every state tensor.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from hybrid.models import HybridState

from .compat import CACHE_INIT_TAKES_LAYERS


def select_rows(state: HybridState, index: torch.Tensor) -> HybridState:
    """The state of rows ``index`` ``(n,)``: ``HybridState.select`` (a gather along the batch axis of every state
    tensor)."""
    return state.select(index.reshape(-1).long())


class HybridCache(Cache):
    """Decode state of ``HybridForCausalLM``: one ``HybridState`` for the batch (ragged when the rows' prompts had
    different lengths).

    ``columns``: input columns consumed so far (pads included), what ``get_seq_length`` reports.
    ``state``: the ``HybridState`` of every row, or None before the first call.
    """

    is_compileable = False

    def __init__(self):
        if CACHE_INIT_TAKES_LAYERS:
            super().__init__(layers=[])
        else:  # pragma: no cover - transformers releases whose Cache.__init__ takes no layers
            super().__init__()
        self.columns = 0
        self.state: HybridState | None = None

    # ------------------------------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return 0 if self.state is None else len(self.state.layers)

    @property
    def batch_size(self) -> int:
        return -1 if self.state is None else self.state.batch_size

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
        return self.state is not None

    @property
    def nbytes(self) -> int:
        """Bytes held by the batch's state."""
        return 0 if self.state is None else self.state.nbytes

    # ------------------------------------------------------------------------------------------ updates

    def reset(self) -> None:
        self.columns = 0
        self.state = None

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("HybridCache: recurrent states cannot be cropped (assisted decoding is unsupported; "
                                  "hybrid's own generate(draft=...) decodes speculatively)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row ``i`` becomes old row ``beam_idx[i]`` (beam search)."""
        self._gather(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._gather(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._gather(torch.arange(self.batch_size).repeat_interleave(repeats))

    def _gather(self, source: torch.Tensor) -> None:
        """Rebuild the batch so that new row ``i`` is old row ``source[i]``."""
        if self.state is not None:
            self.state = self.state.select(source.reshape(-1).long())
