"""The tests part's plugin for its ``pytest`` child (``-p``):

- the Triton kernels the child loads from the cache or compiles are counted into the file named by
  ``$HYBRID_TRITON_LISTEN``, as the check's own parts count theirs (``triton_compiles``);
- the tests that compile a model with Inductor (their ids name ``compiled``; tens of seconds each on a cold GPU)
  run after every other, so that a suite stopped at the part's limit has run the most tests first. The rest keep
  their order."""
from __future__ import annotations

import os

from .triton_compiles import listen

LISTEN_VARIABLE = "HYBRID_TRITON_LISTEN"

if os.environ.get(LISTEN_VARIABLE):
    listen(os.environ[LISTEN_VARIABLE])


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: "compiled" in item.nodeid)  # stable: False first
