"""Room for Dynamo to compile a region: its recompile limit raised, the one mechanism behind the compiled
FlexAttention's room (``window_attention/flex.py``) and the compiled decode step's (``hybrid.models.decoding``).

Past the limit (8 graphs per code object by default) Dynamo runs the code eagerly without a word: an eager
FlexAttention materialises the whole score matrix, and a CUDA graph of a "compiled" step would hold eager kernels.
"""
from __future__ import annotations

__all__ = ["recompile_room"]


def recompile_room(at_least: int, fail_at_limit: bool = False):
    """A ``torch._dynamo.config.patch`` (a context manager) raising Dynamo's recompile limit (``recompile_limit``;
    ``cache_size_limit`` in older torch) to at least ``at_least`` graphs; ``fail_at_limit``: reaching it raises
    instead of running eagerly."""
    import torch._dynamo

    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    options = {limit: max(getattr(config, limit), at_least)}
    if fail_at_limit:
        for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
            if hasattr(config, name):
                options[name] = True
                break
    return config.patch(**options)
