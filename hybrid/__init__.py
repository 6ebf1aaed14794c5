"""hybrid: building blocks of complex-RNN / attention hybrid language models.

Token mixers (``hybrid.mixer.Mixer``s, each with a parallel/chunk ``forward``, a one-token ``step``, a fixed or
growing state, and its options dataclass: ``RecurrenceConfig``, ``AttentionConfig``, ``RetentionConfig``, ``GLAConfig``):

- ``VORecurrence`` (R): VO-RoPE with exponential decay as a complex linear RNN (``hybrid.kernels.complex_scan``);
- ``Attention`` (A): softmax attention with rotary on any of q, k, v, o; GQA; sliding window; shared-KV;
- ``MultiScaleRetention`` (M): RetNet's retention, the baseline;
- ``VOGatedLinearAttention`` (G): VO-RoPE around gated linear attention, a key-addressed matrix state whose
  values turn (``hybrid.kernels.vo_gla``).

``hybrid.rotary`` holds the rotary toolkit (``RotaryConfig``, the options every mixer shares; schedules and
context extension, layouts, placement, CARoPE).

The library is one namespace: ``hybrid.kernels`` (ops), ``hybrid`` (these building blocks), ``hybrid.models``
(HybridConfig, HybridLM) and ``hybrid.train`` (data, trainer, CLIs, benchmarks); imports point that way only,
train → models → hybrid → kernels. The names users type most are re-exported here lazily (PEP 562), so that
``import hybrid`` stays light and the building blocks never import the layers above them:

    from hybrid import HybridConfig, HybridLM, complex_scan, Trainer, TrainConfig
"""
import importlib
from . import rotary
from .attention import Attention, AttentionConfig, AttentionState
from .conv import CausalConv1d
from .gla import GLAConfig, GLAState, VOGatedLinearAttention
from .kv_cache import KVCache, RingKVCache, RowKVCache
from .mixer import Mixer, MixerState
from .mlp import SwiGLU
from .norms import RMSNorm
from .recurrence import RecurrenceConfig, RecurrenceState, VORecurrence
from .retention import MultiScaleRetention, RetentionConfig, RetentionState
from .rotary import RotaryConfig

# name → the module that defines it; resolved on first access by __getattr__ below.
_LAZY = {
    "complex_scan": "hybrid.kernels", "complex_scan_step": "hybrid.kernels",
    "complex_scan_reference": "hybrid.kernels",
    "HybridConfig": "hybrid.models", "HybridLM": "hybrid.models", "HybridState": "hybrid.models",
    "PRESETS": "hybrid.models", "SIZES": "hybrid.models",
    "TrainConfig": "hybrid.train", "Trainer": "hybrid.train", "load_run": "hybrid.train",
    "generate_text": "hybrid.train", "load_checkpoint": "hybrid.train",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value                                   # later look-ups skip this function
        return value
    raise AttributeError(f"module 'hybrid' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [*_LAZY,
    "Attention", "AttentionConfig", "AttentionState", "CausalConv1d", "GLAConfig", "GLAState", "KVCache", "Mixer", "MixerState",
    "MultiScaleRetention", "RMSNorm", "RecurrenceConfig", "RecurrenceState", "RetentionConfig", "RetentionState",
    "RingKVCache", "RotaryConfig", "RowKVCache", "SwiGLU", "VOGatedLinearAttention", "VORecurrence", "rotary",
]
