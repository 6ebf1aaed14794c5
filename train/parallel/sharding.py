"""Training batches whose order does not depend on the number of ranks, so a run resumes on any number.

One ``BatchLoader`` (rank 0 of 1) yields the *global* batch of every optimizer step: ``G = batch_size ×
grad_accum × world_size`` blocks, in the loader's seeded per-epoch order. Rank ``r`` trains on micro-batch
``a`` (of ``grad_accum``) = rows ``[(a·world_size + r)·batch_size, … + batch_size)`` of it. Any layout with
the same ``G`` (2 ranks × 8, 1 rank × 8 × 2 accumulation steps, 1 rank × 16) sees the same sequences in
the same optimizer steps.

The data position is saved as the epoch and the number of blocks consumed in it (plus the total), not as
a per-rank batch index. Resuming with the same ``G`` continues with exactly the next global batch; with a
different ``G`` it continues at batch ``consumed // G_new`` of the same epoch order (when ``G_new`` does
not divide ``consumed``, up to ``G_new − 1`` blocks of the epoch are seen again).

Context parallelism (``cp_group``): ``rank`` and ``world_size`` are then the data-parallel place
(``hybrid.train.parallel.mesh``), so every rank of a context-parallel group reads the same micro-batches, and
each keeps its shard of them: ``(x, y, shard)``, x and y this rank's contiguous ``seq_len / cp`` tokens of every
sequence (``stream``) or its ``b·seq_len / cp`` tokens of the packed row (``documents``), and ``shard`` the
``SequenceShard`` that places them (the documents' global offsets included). The order of the data, and so the
position a checkpoint saves, does not depend on ``cp``.
"""
from __future__ import annotations

import torch

from hybrid.kernels.context_parallel import shard_sequence

from ..data import PreparedData
from ..data.packing import pack_documents

__all__ = ["GlobalBatches"]


class GlobalBatches:
    """``next_step()`` -> this rank's ``grad_accum`` micro-batches ``[(x, y, cu_seqlens), …]`` for one optimizer
    step (``cu_seqlens`` None with ``packing="stream"``); with a ``cp_group``, ``[(x, y, shard), …]``, this rank's
    shard of them (the module docstring)."""

    def __init__(self, data: PreparedData, *, seq_len: int, batch_size: int, grad_accum: int, seed: int,
                 rank: int = 0, world_size: int = 1, packing: str = "stream", cp_group=None):
        self.seq_len, self.batch_size, self.grad_accum = seq_len, batch_size, grad_accum
        self.separator = data.tokenizer.eos_id if packing == "documents" else None
        self.rank, self.world_size, self.cp_group = rank, world_size, cp_group
        self.global_batch = batch_size * grad_accum * world_size
        blocks = max(0, (len(data.train) - 1) // seq_len)
        if blocks < self.global_batch:
            raise ValueError(
                f"batch_size: the training split ({len(data.train)} tokens) holds {blocks} sequences of "
                f"seq_len={seq_len}, fewer than one global batch of batch_size × grad_accum × world_size = "
                f"{batch_size} × {grad_accum} × {world_size} = {self.global_batch}; use more data, a smaller "
                f"--seq-len or a smaller --batch-size"
            )
        self.loader = data.train_loader(seq_len, self.global_batch, seed=seed, rank=0, world_size=1)
        self.samples_total = 0
        self.data = data

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = next(self.loader)  # (G, seq_len) each
        self.samples_total += self.global_batch
        b, ws = self.batch_size, self.world_size
        rows = [(a * ws + self.rank) * b for a in range(self.grad_accum)]
        micro = [self._packed(x[r:r + b], y[r:r + b]) for r in rows]
        return micro if self.cp_group is None else [self._shard(*batch) for batch in micro]

    def _shard(self, x: torch.Tensor, y: torch.Tensor, cu_seqlens: torch.Tensor | None):
        """This context-parallel rank's part of a micro-batch: ``(x, y, shard)`` (the module docstring)."""
        shard = shard_sequence(x.shape[1], self.cp_group, cu_seqlens=cu_seqlens)
        return shard.take(x), shard.take(y), shard

    def _packed(self, x: torch.Tensor, y: torch.Tensor):
        """A micro-batch ``(x, y, cu_seqlens)``: ``(b, L)`` windows and None (``stream``), or one ``(1, b·L)`` row
        with its document offsets (``documents``, ``hybrid.train.data.packing``)."""
        return (x, y, None) if self.separator is None else pack_documents(x, y, self.separator)

    def state_dict(self) -> dict:
        s = self.loader.state_dict()
        return {"seed": s["seed"], "epoch": s["epoch"], "samples_in_epoch": s["position"] * self.global_batch,
                "samples_total": self.samples_total, "seq_len": self.seq_len, "n_blocks": s["n_blocks"],
                "global_batch": self.global_batch, "data_digest": self.data.content_digest}

    def load_state_dict(self, state: dict) -> bool:
        """Continue after the position ``state`` records (saved under any world size or global batch);
        returns whether that position falls on a global-batch boundary (an exact continuation)."""
        for key in ("seq_len", "n_blocks"):
            now = self.seq_len if key == "seq_len" else self.loader.n_blocks
            if state[key] != now:
                raise ValueError(
                    f"data: the checkpoint's data position assumes {key}={state[key]}, but the data now gives "
                    f"{now}; resume with the same --data, --tokenizer, --valid-fraction and --seq-len"
                )
        saved = state.get("data_digest")  # None: a checkpoint from before the digest was kept
        if saved is not None and saved != self.data.content_digest:
            raise ValueError(
                f"data: expected the tokens the run was trained on (sha256 {saved[:12]}…), got others "
                f"({self.data.content_digest[:12]}…); resume on the same data, or start a new run with --init-from"
            )
        self.loader.load_state_dict({
            "seed": state["seed"], "epoch": state["epoch"],
            "position": state["samples_in_epoch"] // self.global_batch,
            "seq_len": self.seq_len, "batch_size": self.global_batch, "world_size": 1,
            "n_blocks": self.loader.n_blocks,
        })
        self.samples_total = int(state["samples_total"])
        return state["samples_in_epoch"] % self.global_batch == 0
