"""A language model's stage on the one loop: next-token cross-entropy on the corpus's global batches, validation loss
and bits per byte (``hybrid.train.lm.evaluate``).

With context parallelism a micro-batch is this rank's shard of the sequences (``(x, y, shard)``,
``hybrid.train.parallel.sharding``): the model runs its context-parallel forward (``HybridLM.forward(shard=…)``),
and the loss is the global token mean of the ``cp`` ranks of those sequences (each rank's sum over the all-reduced
count, ``global_token_mean``). Its value is that mean on every rank of the group (what the loop records and checks
for divergence); its gradient is ``cp`` times this rank's share, because DDP and FSDP2 average the gradients over
every rank of the job: the average of ``cp · share`` over the job's ``dp × cp`` ranks is the mean over the ``dp``
groups of each group's gradient of its mean, as without context parallelism. The logits are scored in at least
float32 (a float64 model in float64).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from hybrid.kernels.context_parallel import SequenceShard, global_token_mean
from hybrid.kernels.host_copies import to_device
from hybrid.precision import at_least_float32

from ..data import PreparedData
from ..data.packing import packed_on_device
from ..loop.stage import Stage
from ..parallel.distributed import DistEnv
from ..parallel.sharding import GlobalBatches
from .evaluate import evaluate

__all__ = ["LMStage"]


class LMStage(Stage):
    """``model`` trains whole; ``train_model`` is what the forward pass calls (wrapped, its blocks compiled:
    ``hybrid.models.CompiledBlocks``)."""

    def __init__(self, *, model: nn.Module, train_model: nn.Module, optimizer, scheduler, batches: GlobalBatches,
                 data: PreparedData, steps: int, seq_len: int, batch_size: int, eval_batches: int | None,
                 packing: str, device: torch.device, env: DistEnv, autocast):
        self.model, self.train_model, self.optimizer, self.scheduler = model, train_model, optimizer, scheduler
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.data_batches, self.data, self.steps = batches, data, steps
        self.seq_len, self.batch_size, self.eval_batches, self.packing = seq_len, batch_size, eval_batches, packing
        self.device, self.env, self.autocast = device, env, autocast
        self.tokens_per_step = batches.global_batch * seq_len

    def micro_batches(self, step: int) -> list:
        return self.data_batches.next_step()

    def loss(self, batch) -> tuple[torch.Tensor, dict]:
        x, y, where = batch  # where: the packed offsets (or None), or this rank's SequenceShard
        x, y = to_device(x, self.device), to_device(y, self.device)
        if isinstance(where, SequenceShard):
            return self._shard_loss(x, y, where), {}
        # with their host values, compiled or not: the model hands its compiled blocks the tensor alone
        cu_seqlens = None if where is None else packed_on_device(where, self.device, compiled=False)
        with self.autocast():
            logits, _ = self.train_model(x, cu_seqlens=cu_seqlens, output_final_state=False)
        return F.cross_entropy(at_least_float32(logits).reshape(-1, logits.shape[-1]), y.reshape(-1)), {}

    def _shard_loss(self, x: torch.Tensor, y: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
        """The global token mean of ``shard``'s group as its value, ``cp ×`` this rank's share as its gradient."""
        if shard.cu_seqlens is not None:
            shard = _on_device(shard, self.device)
        with self.autocast():
            logits, _ = self.train_model(x, shard=shard, output_final_state=False)
        loss_sum = F.cross_entropy(at_least_float32(logits).reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   reduction="sum")
        share, mean = global_token_mean(loss_sum, y.numel(), shard)
        scaled = share * shard.world
        return scaled + (mean.to(scaled.dtype) - scaled).detach()

    @torch.no_grad()
    def evaluate(self) -> dict:
        """The validation split's first ``eval_batches`` global batches of sequences (all of it for None), whatever
        their layout: the same sequences for any ``batch_size × grad_accum × ranks`` of the same global batch."""
        limit = None if self.eval_batches is None else self.eval_batches * self.data_batches.global_batch
        return evaluate(self.model, self.data, seq_len=self.seq_len, batch_size=self.batch_size,
                        max_sequences=limit, device=self.device, env=self.env, autocast=self.autocast,
                        packing=self.packing)


def _on_device(shard: SequenceShard, device: torch.device) -> SequenceShard:
    """``shard`` with its local packed offsets on ``device`` (the loader builds them on the CPU)."""
    if shard.cu_seqlens.device == device:
        return shard
    return dataclasses.replace(shard, cu_seqlens=to_device(shard.cu_seqlens, device))
