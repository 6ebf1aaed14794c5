"""Hugging Face interop (optional extra ``hf``): transformers classes around ``HybridLM``.

    import hybrid.models.hf                      # registers with AutoConfig / AutoModel / AutoModelForCausalLM
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("exported-dir")

``HybridHFConfig`` wraps a ``HybridConfig``; ``HybridForCausalLM`` wraps a ``HybridLM`` (loss from labels,
padded batches, ``generate`` with a ``HybridCache`` of our recurrent states); ``convert`` maps Llama-family
checkpoints (Llama, Mistral, Qwen2) onto the transformer preset. The core library never imports this package.
"""
from .compat import check_version

check_version()

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402

from .cache import HybridCache  # noqa: E402
from .configuration import MODEL_TYPE, HybridHFConfig  # noqa: E402
from .modeling import HybridForCausalLM, HybridPreTrainedModel  # noqa: E402

AutoConfig.register(MODEL_TYPE, HybridHFConfig, exist_ok=True)
AutoModel.register(HybridHFConfig, HybridForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(HybridHFConfig, HybridForCausalLM, exist_ok=True)

__all__ = ["HybridCache", "HybridForCausalLM", "HybridHFConfig", "HybridPreTrainedModel", "MODEL_TYPE"]
