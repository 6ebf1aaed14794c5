"""complex_scan: VO-RoPE with exponential decay as a diagonal complex linear RNN.

Backends live beside each other: ``reference.py`` (sequential, the ground truth), ``chunked.py`` (blocked
scan in torch, any device), ``triton_scan.py`` (Triton parallel scan, CUDA), ``cpu_scan.py`` (the C++
sequential scan of ``cpu_scan.cpp``, built on first use by ``cpu_build.py``; the CPU default).
``interface.py`` checks arguments and picks one.
"""
from .interface import complex_scan, complex_scan_step, resolve_backend
from .reference import complex_scan_reference

__all__ = ["complex_scan", "complex_scan_step", "complex_scan_reference", "resolve_backend"]
