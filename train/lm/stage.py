"""A language model's stage on the one loop: next-token cross-entropy on the corpus's global batches, validation loss
and bits per byte (``hybrid.train.lm.evaluate``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data import PreparedData
from ..loop.stage import Stage
from ..parallel.distributed import DistEnv
from ..parallel.sharding import GlobalBatches
from .evaluate import evaluate

__all__ = ["LMStage"]


class LMStage(Stage):
    """``model`` trains whole; ``train_model`` is what the forward pass calls (wrapped, compiled)."""

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
        x, y, cu_seqlens = batch
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if cu_seqlens is not None:
            cu_seqlens = cu_seqlens.to(self.device, non_blocking=True)
        with self.autocast():
            logits, _ = self.train_model(x, cu_seqlens=cu_seqlens, output_final_state=False)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1)), {}

    @torch.no_grad()
    def evaluate(self) -> dict:
        return evaluate(self.model, self.data, seq_len=self.seq_len, batch_size=self.batch_size,
                        max_batches=self.eval_batches, device=self.device, env=self.env, autocast=self.autocast,
                        packing=self.packing)
