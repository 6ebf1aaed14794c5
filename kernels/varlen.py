"""Packed sequences (flash-attn's `cu_seqlens` convention), shared by every op and by the model.

N sequences of lengths ``L_0 … L_{N−1}`` are packed into one ``(1, total_T, …)`` batch; ``cu_seqlens`` is the
LongTensor ``(N+1,)`` of their offsets ``[0, L_0, L_0 + L_1, …, total_T]``. Sequence n holds the tokens
``cu_seqlens[n] ≤ t < cu_seqlens[n+1]``; its position ``p_t = offset_n + t − cu_seqlens[n]`` restarts at its
own offset (0 unless it continues an earlier call).

The offsets are checked once, where a packed batch enters (``HybridLM.forward``, or an op called directly), and
handed down as one ``PackedOffsets``: the offsets on the device, the same on the host, and the longest sequence.
Every layer and op takes it as it is (no check, no device-to-host read); a plain tensor is checked where it is
given (``check_cu_seqlens``, ``packed_offsets``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .host_copies import on_device  # here too: the ops' first home of it

__all__ = ["PackedOffsets", "aligned_row_length", "packed_offsets", "check_cu_seqlens", "device_offsets",
           "host_offsets", "sequence_ids", "positions_in_sequence", "lengths", "dynamic_count"]


@dataclass(frozen=True)
class PackedOffsets:
    """Checked offsets of N packed sequences: ``cu_seqlens`` ``(N+1,)`` on the inputs' device, ``bounds`` the same
    offsets on the host and ``max_len`` the longest sequence (both None when they were made while torch.compile
    traced, which reads nothing back).

    ``row_len``: every multiple of it is a sequence start (``aligned_row_length``; a batch of windows packed by
    documents: the window length), so an op that runs a sequence's steps one after another (the complex scan)
    may run the packed row as ``total_T / row_len`` rows side by side, exactly as one row, with that many times
    the parallelism. None: not known. Checked against ``bounds`` when both are given."""

    cu_seqlens: Tensor
    bounds: tuple[int, ...] | None
    max_len: int | None
    row_len: int | None = None

    def __post_init__(self):
        if self.row_len is not None and self.bounds is not None and aligned_row_length(self.bounds,
                                                                                      self.row_len) is None:
            raise ValueError(f"row_len: expected a length whose every multiple is a sequence start of a packed "
                             f"batch of {self.bounds[-1]} tokens, got {self.row_len}")

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.numel() - 1

    @classmethod
    def from_bounds(cls, bounds, *, device, dtype=torch.int64) -> "PackedOffsets":
        """Offsets known on the host (a chunk of a packed batch, the loader's offsets): no check, no read back, and
        no stream sync: they reach the device by a non-blocking copy (``torch.tensor(list, device=…)`` waits for
        the stream)."""
        bounds = tuple(int(b) for b in bounds)
        longest = max(b - a for a, b in zip(bounds, bounds[1:]))
        return cls(on_device(bounds, device, dtype), bounds, longest, aligned_row_length(bounds))

    def without_host_values(self, cu_seqlens: Tensor) -> "PackedOffsets":
        """The offsets as a compiled region takes them: ``cu_seqlens`` (this one's, marked dynamic say) with no host
        values, whose tuple would be a guard that changes every batch; ``row_len`` kept (a window length: the same
        from batch to batch)."""
        return PackedOffsets(cu_seqlens, None, None, self.row_len)


def aligned_row_length(bounds, row_len: int | None = None) -> int | None:
    """The shortest length ``L`` that divides the packed batch's ``bounds[-1]`` tokens and whose every multiple is
    one of ``bounds`` (a sequence start), or with ``row_len``, that one if it qualifies; else None. A batch of
    windows packed by documents gives its window length, or less where every window breaks at the same places;
    a single sequence gives its length."""
    total, starts = bounds[-1], set(bounds[:-1])
    if row_len is not None:
        candidates = [row_len]
    else:
        small = [d for d in range(1, int(total ** 0.5) + 1) if total % d == 0]
        candidates = sorted(set(small) | {total // d for d in small})
    for L in candidates:
        if 0 < L <= total and total % L == 0 and all(k in starts for k in range(0, total, L)):
            return L
    return None


def packed_offsets(cu_seqlens, total: int, device, name: str = "cu_seqlens",
                   batch: int | None = None) -> PackedOffsets:
    """``cu_seqlens`` checked for a packed batch of ``total`` tokens on ``device`` (``check_cu_seqlens``: one read
    back to the host), as a ``PackedOffsets``; one already checked passes through if it fits (no read back)."""
    if isinstance(cu_seqlens, PackedOffsets):
        known = cu_seqlens.bounds[-1] if cu_seqlens.bounds is not None else total
        if cu_seqlens.cu_seqlens.device != torch.device(device) or known != total:
            raise ValueError(f"{name}: expected offsets of {total} tokens on {device}, got offsets of {known} on "
                             f"{cu_seqlens.cu_seqlens.device}")
        if batch is not None and batch != 1:
            raise ValueError(f"{name}: expected a packed batch of shape (1, total_T, …), got batch size {batch}")
        return cu_seqlens
    values = _checked(cu_seqlens, total, device, name, batch)
    if values is None:  # traced by torch.compile: nothing read back
        return PackedOffsets(cu_seqlens, None, None)
    return PackedOffsets(cu_seqlens, tuple(values), max(b - a for a, b in zip(values, values[1:])),
                         aligned_row_length(values))


def check_cu_seqlens(cu_seqlens, total: int, device, name: str = "cu_seqlens", batch: int | None = None) -> Tensor:
    """Validate offsets for a packed batch of ``total`` tokens on ``device`` and return them (the tensor; the
    ``cu_seqlens`` of a ``PackedOffsets``, checked once already, as it is).

    One-line ``ValueError`` naming ``name`` when: not a 1-D integer tensor with ≥ 2 entries, on another device,
    not starting at 0, not strictly increasing, not ending at ``total``, or the packed batch has ``batch != 1``.
    The value checks read the (small) tensor on the host; under ``torch.compile`` they are skipped.
    """
    if isinstance(cu_seqlens, PackedOffsets):
        return packed_offsets(cu_seqlens, total, device, name, batch).cu_seqlens
    _checked(cu_seqlens, total, device, name, batch)
    return cu_seqlens


def _checked(cu_seqlens, total: int, device, name: str, batch: int | None) -> list[int] | None:
    """The checks of ``check_cu_seqlens``; the offsets as read back (None under torch.compile)."""
    if not isinstance(cu_seqlens, Tensor):
        raise ValueError(f"{name}: expected a LongTensor (N+1,) of sequence offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D tensor (N+1,) with N ≥ 1, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in (torch.int64, torch.int32) or cu_seqlens.is_floating_point():
        raise ValueError(f"{name}: expected an int64 (or int32) tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.device != torch.device(device):
        raise ValueError(f"{name}: expected a tensor on {device} (the inputs' device), got one on {cu_seqlens.device}")
    if batch is not None and batch != 1:
        raise ValueError(f"{name}: expected a packed batch of shape (1, total_T, …), got batch size {batch}")
    if torch.compiler.is_compiling():
        return None
    values = cu_seqlens.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}: expected offsets starting at 0, got {values[0]}")
    if any(b <= a for a, b in zip(values, values[1:])):
        bad = next(i for i, (a, b) in enumerate(zip(values, values[1:])) if b <= a)
        raise ValueError(f"{name}: expected strictly increasing offsets, got {values[bad]} then {values[bad + 1]} "
                         f"at index {bad}")
    if values[-1] != total:
        raise ValueError(f"{name}: expected offsets ending at total_T={total}, got {values[-1]}")
    return values


def dynamic_count(cu_seqlens: Tensor) -> Tensor:
    """``cu_seqlens`` (a tensor), marked for torch.compile as having a varying length: the number of sequences N
    changes from one packed batch to the next, and the model's packed training path (no states, offset 0) reads
    no Python value of N, so one graph serves every N. Unmarked, the first graph is built for the first N and
    the second call recompiles (Dynamo's automatic dynamic shapes); ``maybe_mark_dynamic``, not ``mark_dynamic``:
    a path that does need N (states out, per-sequence offsets) may still specialize, at the cost of a recompile,
    instead of failing."""
    import torch._dynamo  # here, not at the top: importing the compiler costs every eager user about a second

    torch._dynamo.maybe_mark_dynamic(cu_seqlens, 0)
    return cu_seqlens


def device_offsets(cu_seqlens) -> Tensor:
    """The offsets on the device: a tensor as it is, a ``PackedOffsets``'s ``cu_seqlens``."""
    return cu_seqlens.cu_seqlens if isinstance(cu_seqlens, PackedOffsets) else cu_seqlens


def host_offsets(cu_seqlens) -> list[int]:
    """The offsets on the host: a ``PackedOffsets``'s ``bounds`` (read once, where it was checked), else the tensor
    read back (a device-to-host sync)."""
    if isinstance(cu_seqlens, PackedOffsets) and cu_seqlens.bounds is not None:
        return list(cu_seqlens.bounds)
    return device_offsets(cu_seqlens).tolist()


def whole_rows(T: int, device) -> Tensor:
    """``(2,)`` int64 offsets ``[0, T]`` (T ≥ 1): one sequence per row, made on ``device`` by a kernel.
    ``torch.tensor([0, T], device=…)`` would copy them from the host, which waits for the stream (a sync)."""
    return torch.arange(0, T + 1, T, device=device)


def lengths(cu_seqlens: Tensor) -> Tensor:
    """``(N,)`` sequence lengths."""
    return cu_seqlens[1:] - cu_seqlens[:-1]


def sequence_ids(cu_seqlens: Tensor, total: int) -> Tensor:
    """``(total,)`` int64: the sequence each token belongs to."""
    n = torch.arange(cu_seqlens.numel() - 1, device=cu_seqlens.device)
    return torch.repeat_interleave(n, lengths(cu_seqlens).long(), output_size=total)


def positions_in_sequence(cu_seqlens: Tensor, total: int, offsets: Tensor | None = None) -> Tensor:
    """``(total,)`` int64: ``offset_n + t − cu_seqlens[n]`` for token t of sequence n (``offsets`` ``(N,)``, default
    zeros)."""
    ids = sequence_ids(cu_seqlens, total)
    pos = torch.arange(total, device=cu_seqlens.device) - cu_seqlens.long()[ids]
    return pos if offsets is None else pos + offsets.to(pos.device).long()[ids]
