"""hybrid: building blocks of complex-RNN / attention hybrid language models.

Token mixers (each with a parallel/chunk ``forward``, a one-token ``step`` and a fixed or growing state):

- ``VORecurrence`` (R): VO-RoPE with exponential decay as a complex linear RNN (``kernels.complex_scan``);
- ``Attention`` (A): softmax attention with rotary on any of q, k, v, o; GQA; sliding window; shared-KV;
- ``MultiScaleRetention`` (M): RetNet's retention, the baseline.

``hybrid.rotary`` holds the rotary toolkit (schedules and context extension, layouts, placement, CARoPE).
"""
from . import rotary
from .attention import Attention, AttentionState
from .conv import CausalConv1d
from .mlp import SwiGLU
from .norms import RMSNorm
from .recurrence import RecurrenceState, VORecurrence
from .retention import MultiScaleRetention, RetentionState

__all__ = [
    "Attention", "AttentionState", "CausalConv1d", "MultiScaleRetention", "RMSNorm", "RecurrenceState",
    "RetentionState", "SwiGLU", "VORecurrence", "rotary",
]
