"""``gradient_sync`` finds the module that synchronises gradients behind every wrapper the trainer puts around it."""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from hybrid.models import CompiledBlocks, HybridConfig, HybridLM
from hybrid.train.parallel.distributed import gradient_sync


class StandInDDP(nn.Module):
    """DDP's one method that matters here: ``no_sync``, recorded."""

    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    @contextlib.contextmanager
    def no_sync(self):
        self.calls.append("no_sync")
        yield


def test_gradient_sync_reaches_ddp_behind_compiled_blocks_and_torch_compile():
    model = HybridLM(HybridConfig.preset("hybrid", "tiny", d_model=16, n_layers=3, n_heads=2, window=4))
    calls = []
    for wrapper in (lambda m: m, lambda m: CompiledBlocks(model, m), torch.compile):
        with gradient_sync(wrapper(StandInDDP(calls)), enabled=False):  # an inner micro-batch: no sync
            pass
        with gradient_sync(wrapper(StandInDDP(calls)), enabled=True):  # the last one syncs
            pass
    assert calls == ["no_sync"] * 3
