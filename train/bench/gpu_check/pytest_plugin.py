"""The tests part's plugin for its ``pytest`` child (``-p``): the Triton kernels the child loads from the cache or
compiles are counted into the file named by ``$HYBRID_TRITON_LISTEN``, as the check's own parts count theirs
(``triton_compiles``). (The order the CUDA tests run in is tests/cuda/conftest.py's.)"""
from __future__ import annotations

import os

from .triton_compiles import listen

LISTEN_VARIABLE = "HYBRID_TRITON_LISTEN"

if os.environ.get(LISTEN_VARIABLE):
    listen(os.environ[LISTEN_VARIABLE])
