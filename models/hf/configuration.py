"""HybridHFConfig: a transformers ``PretrainedConfig`` that carries a ``HybridConfig`` losslessly.

The whole ``HybridConfig`` is stored as the dict ``hybrid`` (its ``to_dict()``: the stack's fields and one nested
dict per section), the one source of truth; a ``config.json`` written before the sections holds the old flat
fields there, which ``HybridConfig.from_dict`` reads too. The usual transformers names (``vocab_size``,
``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``tie_word_embeddings``) are mirrors derived from
it for tools that read them (lm-eval, generation utils).
"""
from __future__ import annotations

from transformers import PretrainedConfig

from hybrid.models import HybridConfig

MODEL_TYPE = "hybrid_lm"


class HybridHFConfig(PretrainedConfig):
    """``HybridHFConfig(hybrid=HybridConfig(...) or its dict)``; ``.to_hybrid_config()`` gives it back."""

    model_type = MODEL_TYPE

    def __init__(self, hybrid: HybridConfig | dict | None = None, **kwargs):
        if hybrid is None:
            hybrid = HybridConfig()
        elif isinstance(hybrid, dict):
            hybrid = HybridConfig.from_dict(hybrid)
        elif not isinstance(hybrid, HybridConfig):
            raise ValueError(f"hybrid: expected a HybridConfig, its dict or None, got {type(hybrid).__name__}")
        for mirror in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "tie_word_embeddings"):
            kwargs.pop(mirror, None)  # derived from `hybrid` below; a stale copy in a config.json is ignored
        self.hybrid = hybrid.to_dict()
        self.vocab_size = hybrid.vocab_size
        self.hidden_size = hybrid.d_model
        self.num_hidden_layers = hybrid.n_layers
        self.num_attention_heads = hybrid.n_heads
        self.tie_word_embeddings = hybrid.tie_embeddings
        self.use_cache = kwargs.pop("use_cache", True)
        kwargs.setdefault("dtype", hybrid.dtype)  # transformers' field: the dtype from_pretrained("auto") loads in
        super().__init__(tie_word_embeddings=hybrid.tie_embeddings, **kwargs)

    def to_hybrid_config(self) -> HybridConfig:
        return HybridConfig.from_dict(dict(self.hybrid))
