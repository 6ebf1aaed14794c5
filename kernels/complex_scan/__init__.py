"""complex_scan: VO-RoPE with exponential decay as a diagonal complex linear RNN.

    s_t = exp(log_decay_t) · exp(−i·theta_t) · s_{t−1} + x_t,      y_t = s_t

Backends live beside each other: ``reference.py`` (sequential, the ground truth), ``blocked.py`` (blocked
scan in torch, any device), ``triton_scan.py`` (Triton parallel scan, CUDA; its second layout in
``triton_runs.py``, the device functions of both in ``triton_device.py``), ``cpu_scan.py`` (the C++
sequential scan of ``cpu_scan.cpp``, built on first use by ``cpu_build.py``; the CPU default).
``ops.py`` registers the cpu / torch / triton forward and backward as the custom ops ``hybrid::complex_scan``
and ``hybrid::complex_scan_backward`` (torch.compile traces through them, fullgraph). ``interface.py`` checks
arguments, picks a backend and runs packed sequences (``cu_seqlens``, fla's op contract): ``complex_scan(x,
log_decay, theta, initial_state=None, *, output_final_state=False, cu_seqlens=None, ...) -> (y, final or None)``.
"""
import os

from ..triton_interpreter import squeeze_index_in_old_interpreters
from .interface import (complex_scan, complex_scan_step, complex_scan_transition_step, resolve_backend,
                        transition_pairs)
from .reference import complex_scan_reference

if os.environ.get("TRITON_INTERPRET") == "1":  # before any kernel runs: Triton 3.6's interpreter under NumPy 2.4
    squeeze_index_in_old_interpreters()

__all__ = ["complex_scan", "complex_scan_step", "complex_scan_transition_step", "complex_scan_reference",
           "resolve_backend", "transition_pairs"]
