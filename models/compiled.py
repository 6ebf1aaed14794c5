"""Regional compilation: a ``HybridLM`` called with each block under ``torch.compile`` (torchtitan compiles its
training model the same way), the embedding, final norm and head eager.

A whole-model ``torch.compile`` traces and lowers every layer of the stack; blocks of one kind share their code,
so compiling blocks one by one traces one graph per kind of block (Dynamo's cache reuses it for every block of
that kind: their weights are its inputs, not its constants). At d_model 512 and 8 layers the first compiled step
took 0.56× (Transformer) and 0.76× (hybrid) of the whole model's on the CPU (docs/training.md, "Compile"); what
a whole-graph compile could still fuse, across a block's edge, is one residual add and norm per layer.

``CompiledBlocks(model)`` is what a training step calls; ``model`` itself stays eager, so evaluation, decoding and
measurements at other lengths never pay a compile. It is meant for the training path (no state in or out): a
packed batch's offsets reach the blocks without their host values (``HybridLM.blocks_run_as``), as a traced
model sees them.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .lm import HybridLM

__all__ = ["CompiledBlocks"]


class CompiledBlocks:
    """Call ``model`` (through ``call``: the same model wrapped in DDP, or the model) with each of its blocks under
    ``torch.compile(block, **options)``. The compiled blocks share the model's parameters; nothing is copied and
    the model's state dict is unchanged."""

    def __init__(self, model: HybridLM, call: Callable | None = None, **options):
        if not isinstance(model, HybridLM):
            raise ValueError(f"model: expected a HybridLM, got {type(model).__name__}")
        self.model = model
        self.wrapped = model if call is None else call
        self.blocks = [torch.compile(block, **options) for block in model.blocks]

    def __call__(self, *args, **kwargs):
        with self.model.blocks_run_as(self.blocks):
            return self.wrapped(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CompiledBlocks({len(self.blocks)} blocks of {type(self.model).__name__})"
