"""The model-level decode state: one state per layer plus the number of tokens seen, kept here once."""
from __future__ import annotations

from dataclasses import dataclass, field

from hybrid.mixer import MixerState


@dataclass
class HybridState:
    """Per-layer mixer states, in layer order, and the tokens seen.

    ``offset`` (the tokens seen: the position of the next token) is the one record of the position: layer states
    hold none, and the model passes ``offset`` to every mixer's ``forward`` / ``step``.

    Passing it back to ``HybridLM.forward`` / ``step`` continues the sequence in any mode: processing ``a`` and
    then ``b`` from the returned state equals processing ``a ++ b``.

    Reuse: under autograd (training) nothing is modified in place. Without it (decoding, ``generate``), the
    attention caches are written in place, so a state is consumed by the call that continues it: R and M states
    are always replaced, never written, and a global KV cache copies on write, but a sliding-window ring is
    overwritten, and continuing an older windowed state raises a ``ValueError``. To continue one state several
    times (e.g. to branch continuations from one prompt), ``clone()`` it first, once per extra branch.
    """

    layers: list[MixerState] = field(default_factory=list)
    offset: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the state's tensors: fixed for R/M layers and windowed attention, growing with
        global attention."""
        return sum(layer.nbytes for layer in self.layers)

    def clone(self) -> "HybridState":
        """A state that continues independently of this one: each layer's ``clone()`` (attention caches
        copied; R and M states are never written in place, so they clone to themselves)."""
        layers = [None if layer is None else layer.clone() for layer in self.layers]
        return HybridState(layers=layers, offset=self.offset)

    @classmethod
    def cat(cls, states: list["HybridState"]) -> "HybridState":
        """The states of several sequences that have seen the same number of tokens as one batch (rows in
        order), e.g. the per-sequence states of a packed forward (``HybridLM.forward(..., cu_seqlens=...)``)."""
        if not states or any(s.offset != states[0].offset for s in states):
            raise ValueError(f"states: expected a non-empty list of states at one offset, got offsets "
                             f"{sorted({s.offset for s in states})}")
        layers = [type(layer).cat([s.layers[i] for s in states]) for i, layer in enumerate(states[0].layers)]
        return cls(layers=layers, offset=states[0].offset)
