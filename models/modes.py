"""The model's three ways of running a sequence, each returning a state that continues it (see ``HybridLM``):
"parallel" (all tokens at once), "chunked" (blocks of ``chunk_size`` tokens, ``DEFAULT_CHUNK_SIZE`` unless
given) and "recurrent" (one token at a time)."""

MODES = ("parallel", "chunked", "recurrent")
DEFAULT_CHUNK_SIZE = 128
