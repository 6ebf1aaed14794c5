"""window_attention: causal sliding-window softmax attention in O(T·w), with GQA and a carried prefix.

Ways live beside each other: ``reference.py`` (dense mask, the ground truth), ``blocked.py`` (block-local SDPA,
any device), ``flex.py`` (FlexAttention), ``flash.py`` (flash-attn's window). ``interface.py`` checks
arguments and picks one.
"""
from .blocked import band_mask, sdpa_bthd, window_attention_blocked
from .interface import BACKENDS, resolve_window_backend, window_attention
from .reference import window_attention_reference

__all__ = ["BACKENDS", "band_mask", "resolve_window_backend", "sdpa_bthd", "window_attention",
           "window_attention_blocked", "window_attention_reference"]
