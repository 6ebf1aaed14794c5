"""fla-core's Triton autotuners held to one config each, for the tests part (numbers, not speed).

fla's chunked simple-GLA kernels autotune on first use over up to 48 configs (``chunk_fwd_kernel_h``: two block
sizes each way, four warp counts, three stage counts), each compiled for every new autotune key (decay kinds,
head sizes, with or without states). In the check's tests part on 2026-11-28 (H200) the suite stopped at its limit
inside the first G test on fla. A correctness test needs one valid config, not the fastest: each autotuner here
keeps the one asking least of the GPU (fewest stages, smallest blocks, the warp count nearest 4), which compiles
once per key and is not timed against the others. The speed parts never hold configs.
"""
from __future__ import annotations

import importlib
import sys

# the fla modules whose kernels the G mixer runs (``hybrid.kernels.vo_gla``): importing them loads their autotuners
FLA_MODULES = ("fla.ops.simple_gla",)


def _demand(config) -> tuple:
    """How much a Triton config asks of the GPU, least first: stages, the product of its int block sizes, the
    distance of its warp count from 4."""
    blocks = 1
    for value in config.kwargs.values():
        if isinstance(value, int) and not isinstance(value, bool):
            blocks *= value
    return (config.num_stages, blocks, abs(config.num_warps - 4))


def _autotuners(kernel):
    """The Triton autotuners inside ``kernel`` (a kernel under ``triton.heuristics`` wraps its autotuner)."""
    from triton.runtime.autotuner import Autotuner

    seen = set()
    while kernel is not None and id(kernel) not in seen:
        seen.add(id(kernel))
        if isinstance(kernel, Autotuner):
            yield kernel
        kernel = getattr(kernel, "fn", None)


def hold_to_one_config(prefix: str = "fla.") -> int:
    """Hold every autotuner of the loaded modules named ``prefix``… to its least demanding config; return how many
    had more than one. Imports ``FLA_MODULES`` first when ``prefix`` is fla's (nothing when fla does not import)."""
    if prefix == "fla.":
        for name in FLA_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # ImportError, or fla's own import-time failure on a machine without its needs
                return 0
    held = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(prefix):
            continue
        for value in list(vars(module).values()):
            for tuner in _autotuners(value):
                if len(tuner.configs) > 1:
                    tuner.configs = [min(tuner.configs, key=_demand)]
                    held += 1
    return held
