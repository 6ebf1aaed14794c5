"""causal_conv: the causal depthwise conv1d of the recurrence block, with a carried tail and packed sequences.

Ways live beside each other: ``reference.py`` (a loop over time, per sequence: the ground truth),
``depthwise.py`` (``F.conv1d(groups=C)``, any device; packed sequences as one stream with their tails),
``fused.py`` (the ``causal_conv1d`` package on CUDA, optional), ``step.py`` (one token, for decoding).
``interface.py`` checks arguments and picks one. The state is the last W−1 inputs, ``(N, W−1, C)``.
"""
from .depthwise import causal_conv1d_torch
from .interface import BACKEND_ENV, BACKENDS, causal_conv1d, resolve_conv_backend, select_conv_backend
from .reference import causal_conv1d_reference
from .step import causal_conv1d_step

__all__ = ["BACKENDS", "BACKEND_ENV", "causal_conv1d", "causal_conv1d_reference", "causal_conv1d_step",
           "causal_conv1d_torch", "resolve_conv_backend", "select_conv_backend"]
