"""The decode step, eager or compiled: what ``generate(..., compile=...)`` and ``Decoder(..., compile=...)`` call
once per new token for the whole batch."""
from __future__ import annotations

import torch
import torch.fx.experimental._config as fx_config

from .graphed_step import GraphedStep


# compile= value: GraphedStep's recorder, and whether the step it records is compiled
GRAPHS = {"cuda-graph": ("cuda", False), "compiled-cuda-graph": ("cuda", True), "traced-graph": ("traced", False)}


def decode_step(model: torch.nn.Module, compile=False, capacity: int | None = None):
    """What runs each decode step (``step(token (B, 1), state=state)``): ``model`` itself, or, with ``compile``
    (True or a dict of ``torch.compile`` options), ``torch.compile(model, dynamic=True, **options)``: positions,
    cache sizes and the batch symbolic from the first trace (a batch of one specialises), so one compile serves
    every step, and a later call's wrapper finds the graphs Dynamo keeps on the model's code. An eager step is a
    few hundred ops, each dispatched from Python and many a kernel launch on a GPU (where decoding is bound by
    them); compiled, the elementwise ones fuse.

    ``compile="cuda-graph"``: the eager step recorded as a CUDA graph and replayed (``graphed_step.GraphedStep``;
    ``capacity``: the slots of a global attention cache, e.g. the longest prompt plus the new tokens);
    ``"compiled-cuda-graph"``: the same, recording the step as ``torch.compile`` runs it (Inductor's fused kernels:
    fewer launches a step); ``"traced-graph"``: the eager one with its CPU stand-in (tests and dry runs; slower
    than eager)."""
    if compile is False:
        return model
    if isinstance(compile, str) and compile in GRAPHS:
        recorder, compiled = GRAPHS[compile]
        return GraphedStep(model, recorder, capacity, compiled=compiled)
    if compile is True:
        options = {}
    elif isinstance(compile, dict):
        options = dict(compile)
    else:
        raise ValueError(f"compile: expected True, False, a dict of torch.compile options, or one of "
                         f"{sorted(GRAPHS)}, got {compile!r}")
    compiled = torch.compile(model, **{"dynamic": True, **options})

    def step(*args, **kwargs):
        # Each size its own symbol. With duck sizing (the default) sizes equal at the first trace share one: a
        # batch of 3 rows was the conv state's W − 1 = 3, so the graph fixed the batch to 3, and continuous
        # batching compiled again for each such batch (6 graphs where 4 serve; tests/models/decoding).
        with fx_config.patch(use_duck_shape=False):
            return compiled(*args, **kwargs)

    return step
