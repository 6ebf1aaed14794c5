"""Validation loss and bits per byte, summed over every rank's share of the validation stream."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hybrid.kernels.host_copies import to_device
from hybrid.precision import at_least_float32

from ..data import PreparedData
from ..data.packing import pack_documents, packed_on_device
from ..parallel.distributed import DistEnv

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: PreparedData, *, seq_len: int, batch_size: int,
             max_sequences: int | None = None, device: torch.device | str = "cpu", env: DistEnv | None = None,
             autocast=contextlib.nullcontext, packing: str = "stream") -> dict:
    """``{"val_loss", "val_bpb", "val_tokens"}``: mean cross-entropy (nats) per target token and bits per byte.

    ``max_sequences`` (None = all) scores the validation split's first that many sequences of ``seq_len``, over
    all ranks together, in forward passes of ``batch_size`` sequences on each rank; the ranks take interleaved
    blocks, so the set of sequences scored depends neither on the number of ranks nor on ``batch_size``. With a
    limit, ``val_bpb`` converts the loss of that prefix with the whole split's bytes per token (an estimate).
    Every rank runs the same number of forward passes (padding with a dummy one), as FSDP needs.
    ``packing`` ("stream" or "documents", ``hybrid.train.data.packing``) scores the windows as training sees them.
    """
    env = env or DistEnv()
    batches = data.valid_batches(seq_len, batch_size, rank=env.rank, world_size=env.world_size,
                                 max_sequences=max_sequences)
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, number of targets)
    dummy = torch.zeros(1, 1, dtype=torch.long, device=device)
    try:
        while True:
            batch = next(batches, None)
            if env.distributed:  # go on while any rank has a batch left
                more = torch.tensor([batch is not None], dtype=torch.int32, device=device)
                if not env.all_reduce(more, op=dist.ReduceOp.MAX).item():
                    break
            elif batch is None:
                break
            if batch is None:
                with autocast():
                    model(dummy, output_final_state=False)
                continue
            x, y = batch
            cu_seqlens = None
            if packing == "documents":
                x, y, cu_seqlens = pack_documents(x, y, data.tokenizer.eos_id)
                cu_seqlens = packed_on_device(cu_seqlens, device, compiled=False)
            x, y = to_device(x, device), to_device(y, device)
            with autocast():
                logits, _ = model(x, cu_seqlens=cu_seqlens, output_final_state=False)
            # as training scores it: a float64 model in float64, anything narrower in float32
            loss = F.cross_entropy(at_least_float32(logits).reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   reduction="sum")
            totals[0] += loss.double()
            totals[1] += y.numel()
    finally:
        model.train(was_training)
    env.all_reduce(totals)
    mean = (totals[0] / totals[1]).item()
    return {"val_loss": mean, "val_bpb": data.bpb(mean), "val_tokens": int(totals[1].item())}
