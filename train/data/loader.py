"""Batches from a 1-D token stream: blocks of `seq_len + 1` tokens at stride `seq_len`.

Block `i` is `stream[i*L : i*L + L + 1]`; inputs are its first `L` tokens, targets its last `L`, so
consecutive blocks share one token and every token after the first is a target exactly once.

`BatchLoader` (training) is an endless, deterministic iterator. Epoch `e` visits the full blocks in the
order `numpy.random.default_rng([seed, e]).permutation(n_blocks)`; rank `r` of `world_size` takes the
`r`-th of `world_size` equal contiguous slices of that order (disjoint across ranks, the same number of
batches on every rank) and drops the incomplete last batch. `state_dict()` is `(seed, epoch, position)` plus
the shape it was made for; `load_state_dict()` continues with the very next batch.

`eval_batches` (validation) covers every target once, in order: full blocks in batches, then the tail
(shorter than `L + 1` tokens) as a batch of one; rank `r` takes blocks `r, r + world_size, …`. With
`max_sequences` it covers the split's first that many sequences (the tail being the last one) over all ranks
together: the same set whatever the batch size and the number of ranks.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from hybrid.checks import check_positive_int

__all__ = ["BatchLoader", "eval_batches", "num_blocks"]


def num_blocks(n_tokens: int, seq_len: int) -> int:
    """Full blocks of `seq_len + 1` tokens at stride `seq_len` in a stream of `n_tokens`."""
    return max(0, (n_tokens - 1) // seq_len)


def _gather(stream: np.ndarray, starts: np.ndarray, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = stream[starts[:, None] + np.arange(length)]  # (B, length)
    t = torch.from_numpy(rows.astype(np.int64))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class BatchLoader:
    """Endless training batches `(inputs, targets)`, each a LongTensor `(batch_size, seq_len)`."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch_size: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1):
        for name, v in (("seq_len", seq_len), ("batch_size", batch_size), ("world_size", world_size)):
            check_positive_int(name, v)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected an int in [0, world_size={world_size}), got {rank}")
        self.stream = np.asarray(stream)
        self.seq_len, self.batch_size = seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.n_blocks = num_blocks(len(self.stream), seq_len)
        self.blocks_per_rank = self.n_blocks // world_size
        self.batches_per_epoch = self.blocks_per_rank // batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"BatchLoader: {len(self.stream)} tokens make {self.n_blocks} blocks of seq_len={seq_len}, "
                f"fewer than batch_size × world_size = {batch_size * world_size}: use more data or smaller sizes"
            )
        self.epoch, self.position = 0, 0
        self._order: np.ndarray | None = None

    def _epoch_order(self) -> np.ndarray:
        if self._order is None:
            perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n_blocks)
            lo = self.rank * self.blocks_per_rank
            self._order = perm[lo : lo + self.blocks_per_rank]
        return self._order

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position >= self.batches_per_epoch:
            self.epoch, self.position, self._order = self.epoch + 1, 0, None
        b = self.batch_size
        blocks = self._epoch_order()[self.position * b : (self.position + 1) * b]
        self.position += 1
        return _gather(self.stream, blocks * self.seq_len, self.seq_len + 1)

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    def state_dict(self) -> dict:
        """Plain ints: where the next batch comes from, and the layout it assumes."""
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "seq_len": self.seq_len,
                "batch_size": self.batch_size, "world_size": self.world_size, "n_blocks": self.n_blocks}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seq_len", "batch_size", "world_size", "n_blocks"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"BatchLoader.load_state_dict: {key} was {state[key]} when saved, is {getattr(self, key)} "
                    f"now; an exact resume needs the same data and layout"
                )
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._order = None


def eval_batches(stream: np.ndarray, seq_len: int, batch_size: int, *, rank: int = 0, world_size: int = 1,
                 max_batches: int | None = None,
                 max_sequences: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Validation batches covering each target of `stream` once (this rank's share); see the module doc.
    `max_batches` stops after that many of this rank's batches, `max_sequences` after the split's first that many
    sequences over all ranks."""
    stream = np.asarray(stream)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected an int in [0, world_size={world_size}), got {rank}")
    if len(stream) < 2:
        raise ValueError(f"eval_batches: the stream needs at least 2 tokens, has {len(stream)}")
    full = num_blocks(len(stream), seq_len)
    mine = np.arange(rank, full if max_sequences is None else min(full, max_sequences), world_size)
    done = 0
    for i in range(0, len(mine), batch_size):
        if max_batches is not None and done >= max_batches:
            return
        yield _gather(stream, mine[i : i + batch_size] * seq_len, seq_len + 1)
        done += 1
    tail_start = full * seq_len
    if len(stream) - tail_start >= 2 and full % world_size == rank:
        if (max_batches is None or done < max_batches) and (max_sequences is None or max_sequences > full):
            yield _gather(stream, np.asarray([tail_start]), len(stream) - tail_start)
