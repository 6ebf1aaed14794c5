"""The model-level decode state: one state per layer plus the number of tokens seen."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HybridState:
    """Per-layer mixer states (``RecurrenceState``, ``AttentionState`` or ``RetentionState``).

    Passing it back to ``HybridLM.forward`` continues the sequence in any mode: processing ``a`` and then
    ``b`` from the returned state equals processing ``a ++ b``. States are never modified in place, so an
    old state can be reused (e.g. to branch several continuations from one prompt).
    """

    layers: list = field(default_factory=list)
    offset: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the state's tensors: fixed for R/M layers and windowed attention, growing with
        global attention."""
        return sum(layer.nbytes for layer in self.layers)
