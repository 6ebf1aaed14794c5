"""window_attention: causal softmax attention, sliding-window (O(T·w)) or global, with GQA, a carried prefix
and packed sequences.

Ways live beside each other: ``reference.py`` (dense mask, the ground truth), ``blocked.py`` (block-local SDPA,
any device), ``flex.py`` (FlexAttention), ``flash.py`` (flash-attn). ``varlen.py`` holds the packed-sequence
indices (the offsets are checked by ``hybrid.kernels.varlen``); ``interface.py`` checks arguments and picks one.

The op contract's state, for attention, is its keys: there is no ``initial_state`` / ``output_final_state``.
A carried prefix (a KV cache, or the previous chunk's last w − 1 tokens) comes in as the first keys of k, v:
``(B, S ≥ T, G, D)`` bottom-right aligned, or, packed, each sequence's keys delimited by ``cu_seqlens_k`` with
its queries the last of them (flash-attn's varlen convention). The caller keeps the cache.
"""
from .blocked import band_mask, sdpa_bthd, window_attention_blocked
from .interface import BACKENDS, resolve_window_backend, window_attention
from .reference import window_attention_reference

__all__ = ["BACKENDS", "band_mask", "resolve_window_backend", "sdpa_bthd", "window_attention",
           "window_attention_blocked", "window_attention_reference"]
