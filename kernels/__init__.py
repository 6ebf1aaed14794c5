"""Ops: Triton kernels and torch implementations, each with a plain reference beside it. No nn.Modules."""
from .complex_scan import complex_scan, complex_scan_reference, complex_scan_step
from .retention import retention_chunkwise, retention_reference, retention_step
from .window_attention import window_attention, window_attention_reference

__all__ = ["complex_scan", "complex_scan_step", "complex_scan_reference", "window_attention",
           "window_attention_reference", "retention_chunkwise", "retention_step", "retention_reference"]
