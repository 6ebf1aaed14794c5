"""Decoding many sequences at once (docs/decoding.md): prompts of any lengths as one batch (``prompts``),
continuous batching over a stream of requests (``decoder``), speculative decoding with an exact rollback
(``speculative``), and the decode step compiled or replayed from a CUDA graph (``compiled_step``, ``graphed_step``).
``hybrid.models.generation.generate`` reaches the first and the last; the state API they stand on is
``HybridState``'s (``models/state.py``) and every mixer state's (``hybrid.mixer``)."""
from .compiled_step import decode_step
from .decoder import Completion, Decoder, Request, generate_many
from .graphed_step import GraphedStep
from .prompts import prefill, prompt_list
from .speculative import SpeculativeStats, draft_from_layers, speculative_decode

__all__ = ["Completion", "Decoder", "GraphedStep", "Request", "SpeculativeStats", "decode_step", "draft_from_layers",
           "generate_many", "prefill", "prompt_list", "speculative_decode"]
