"""A pytest plugin (``-p``) for the tests part's child: it counts the Triton kernels the child loads from the cache
or compiles into the file named by ``$HYBRID_TRITON_LISTEN``, as the check's own parts do (``triton_compiles``)."""
from __future__ import annotations

import os

from .triton_compiles import listen

LISTEN_VARIABLE = "HYBRID_TRITON_LISTEN"

if os.environ.get(LISTEN_VARIABLE):
    listen(os.environ[LISTEN_VARIABLE])
