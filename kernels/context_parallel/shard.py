"""`SequenceShard`: this rank's contiguous part of one long sequence split across a context-parallel group.

A sequence of ``total`` tokens (dim 1 of every activation) is cut into ``world`` equal, contiguous shards; rank r
holds tokens ``start = r·L … start + L − 1`` (L = total / world). With packed documents (``cu_seqlens``, the
*global* offsets, the same tensor on every rank) the shard holds pieces of documents: the local offsets
``cu_seqlens`` ``(n+1,)`` cut it into n pieces, piece i of document ``piece_docs[i]`` starting at position
``piece_offsets[i]`` of that document. Only the first piece can continue a document begun on an earlier rank
(``continues``); every other piece starts its document inside the shard.

Without packing each batch row is one sequence from position 0, so the shard is one piece at offset ``start``.

The shard knows every rank's layout (all ranks hold the same global offsets), so a rank can tell, without
asking, whether the state leaving an earlier shard reaches it.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from ..checks import as_int
from ..varlen import PackedOffsets, check_cu_seqlens, on_device, positions_in_sequence

__all__ = ["SequenceShard", "shard_sequence"]


@dataclass(frozen=True, eq=False)
class SequenceShard:
    """One rank's shard. Build it with `shard_sequence`.

    group: the context-parallel process group (None: one rank, no collectives). rank, world: this rank's place
    in it. start, length, total: the shard is tokens ``start … start + length − 1`` of ``total``.
    bounds: the global document offsets as a tuple of ints (``(0, total)`` without packing); packed: whether the
    caller packed documents (``cu_seqlens`` given). cu_seqlens: the local offsets ``(n+1,)`` LongTensor (None
    when not packed). piece_docs, piece_offsets: per local piece, its document and the position of its first
    token in that document.
    """

    group: object
    rank: int
    world: int
    start: int
    length: int
    total: int
    bounds: tuple[int, ...]
    packed: bool
    cu_seqlens: Tensor | None
    piece_docs: tuple[int, ...]
    piece_offsets: tuple[int, ...]

    # ------------------------------------------------------------------------------------------ layout

    @property
    def continues(self) -> bool:
        """The shard's first token continues a document begun on an earlier rank (a carry / halo comes in)."""
        return self.piece_offsets[0] > 0

    @property
    def first_piece_length(self) -> int:
        """Tokens of the first piece: those the incoming carry reaches (all of them without packing)."""
        cu = self.local_bounds
        return cu[1] - cu[0]

    @property
    def local_bounds(self) -> tuple[int, ...]:
        """The local piece offsets as ints."""
        return self._local_bounds(self.start)

    def passes_through(self, rank: int | None = None) -> bool:
        """Whether the state entering shard ``rank`` (default this one) leaves it still alive: the shard is one
        piece continuing a document. Else the shard's transition is zero (a document starts inside it)."""
        start = self.start if rank is None else rank * self.length
        doc = bisect.bisect_right(self.bounds, start) - 1
        return self.bounds[doc] < start and self.bounds[doc + 1] >= start + self.length

    def _local_bounds(self, start: int) -> tuple[int, ...]:
        end = start + self.length
        inner = [b - start for b in self.bounds if start < b < end]
        return (0, *inner, self.length)

    def tokens_before(self, size: int) -> int:
        """How many of the ``size`` tokens before the shard belong to its first piece's document."""
        return min(size, self.piece_offsets[0])

    # ------------------------------------------------------------------------------------------ tensors

    def check_local(self, name: str, t: Tensor) -> None:
        """A one-line ValueError unless ``t`` is this rank's part of the sequence: ``length`` tokens in dim 1 (one
        row when packed)."""
        if t.dim() < 2 or t.shape[1] != self.length or (self.packed and t.shape[0] != 1):
            want = f"({'1' if self.packed else 'B'}, {self.length}, …)"
            raise ValueError(f"{name}: expected this rank's shard of shape {want} ({self!r}), got {tuple(t.shape)}")

    def take(self, t: Tensor, dim: int = 1) -> Tensor:
        """This rank's part of a whole-sequence tensor (a view): ``t.narrow(dim, start, length)``."""
        if t.shape[dim] != self.total:
            raise ValueError(f"t: expected {self.total} tokens in dim {dim} (the whole sequence), got {t.shape[dim]}")
        return t.narrow(dim, self.start, self.length)

    def positions(self, device=None) -> Tensor:
        """``(length,)`` int64: each token's position in its document (rotary and absolute positions)."""
        if self.cu_seqlens is None:
            return torch.arange(self.start, self.start + self.length, device=device)
        offsets = on_device(self.piece_offsets, self.cu_seqlens.device)
        return positions_in_sequence(self.cu_seqlens, self.length, offsets).to(device or self.cu_seqlens.device)

    def __repr__(self) -> str:
        pieces = "" if not self.packed else f", pieces={len(self.piece_docs)}, continues={self.continues}"
        return (f"SequenceShard(rank={self.rank}/{self.world}, tokens {self.start}…{self.start + self.length - 1} "
                f"of {self.total}{pieces})")


def _group_place(group) -> tuple[int, int]:
    if group is None:
        return 0, 1
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: expected a process group of an initialised torch.distributed job, got one with no "
                         "job running (call torch.distributed.init_process_group first, or pass group=None)")
    return dist.get_rank(group), dist.get_world_size(group)


def shard_sequence(total: int, group=None, *, cu_seqlens: Tensor | None = None) -> SequenceShard:
    """This rank's shard of a sequence of ``total`` tokens split across ``group`` (None: one rank, no CP).

    ``cu_seqlens``: None (each batch row one sequence) or the global offsets ``(N+1,)`` of documents packed into
    one ``(1, total)`` row, the same tensor on every rank (``hybrid.kernels.varlen``). Raises a one-line
    ``ValueError`` when ``total`` does not divide into the group's ranks (pad the batch to a multiple of it).
    """
    n = as_int(total)
    if n is None or n < 1:
        raise ValueError(f"total: expected a positive int (the sequence length), got {total!r}")
    rank, world = _group_place(group)
    if n % world:
        raise ValueError(f"sequence length: expected a multiple of the context-parallel size {world} (equal shards; "
                         f"pad the batch to {-(-n // world) * world} tokens), got {n}")
    length, start = n // world, rank * (n // world)
    if cu_seqlens is None:
        bounds, local_cu, docs, offsets = (0, n), None, (0,), (start,)
    else:
        if isinstance(cu_seqlens, PackedOffsets):
            cu_seqlens = cu_seqlens.cu_seqlens
        check_cu_seqlens(cu_seqlens, n, cu_seqlens.device if isinstance(cu_seqlens, Tensor) else "cpu")
        bounds = tuple(cu_seqlens.tolist())
        first = bisect.bisect_right(bounds, start) - 1
        inner = [b - start for b in bounds if start < b < start + length]
        local = (0, *inner, length)
        docs = tuple(range(first, first + len(local) - 1))
        offsets = (start - bounds[first],) + (0,) * (len(local) - 2)
        local_cu = on_device(local, cu_seqlens.device)
    return SequenceShard(group=group, rank=rank, world=world, start=start, length=length, total=n, bounds=bounds,
                         packed=cu_seqlens is not None, cu_seqlens=local_cu, piece_docs=docs, piece_offsets=offsets)
