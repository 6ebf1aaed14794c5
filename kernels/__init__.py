"""Ops: Triton kernels and torch implementations, each with a plain reference beside it. No nn.Modules.

Each op picks its backend from the call, else from ``$HYBRID_<OP>_BACKEND`` (``hybrid.kernels.env``).
"""
__all__ = ["complex_scan", "complex_scan_step", "complex_scan_reference", "window_attention",
           "window_attention_reference", "retention_chunkwise", "retention_step", "retention_reference",
           "causal_conv1d", "causal_conv1d_step", "causal_conv1d_reference", "vo_gla", "vo_gla_step",
           "vo_gla_reference"]

# This folder installs as ``hybrid.kernels``. Run from a checkout's root, the folder is also reachable as a
# top-level ``kernels``, and transformers imports that name to probe for the Hugging Face `kernels` package. A
# second copy of the ops would register the custom ops (``hybrid::complex_scan``, ``hybrid::vo_gla`` ...) again, over the first, so
# that copy stays empty.
if __name__ == "hybrid.kernels":
    from .causal_conv import causal_conv1d, causal_conv1d_reference, causal_conv1d_step
    from .complex_scan import complex_scan, complex_scan_reference, complex_scan_step
    from .retention import retention_chunkwise, retention_reference, retention_step
    from .vo_gla import vo_gla, vo_gla_reference, vo_gla_step
    from .window_attention import window_attention, window_attention_reference
else:
    __all__ = []
