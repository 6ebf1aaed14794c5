"""How a batch of windows cut from the token stream is fed to the model: packed by documents, or as one stream.

The stream is ``[eos] doc₁ [eos] doc₂ …`` (``prepare.py``); a training or validation batch is ``B`` windows of
``L`` tokens cut from it at arbitrary places, so a window may hold the end of one document and the start of
the next.

- ``"stream"``: each window is one sequence; every mixer carries its state, and attention reads, across the
  ``eos`` that separates two documents (the classic GPT-2 recipe).
- ``"documents"``: each window is cut at every ``eos`` it holds (the ``eos`` opens the document it precedes),
  and the ``B`` windows are packed into one ``(1, B·L)`` row with ``cu_seqlens`` marking both the window edges
  and the document starts (``hybrid.kernels.varlen``). Every mixer restarts at each offset and positions
  restart at 0, as in fla's varlen training, Mamba's ``seq_idx`` and transformers' ``DataCollatorWithFlattening``.

Targets are unchanged: every token is scored once in either packing; only the context a token sees differs.
"""
from __future__ import annotations

import torch

from hybrid.kernels.host_copies import to_device
from hybrid.kernels.varlen import PackedOffsets, dynamic_count

__all__ = ["PACKINGS", "pack_documents", "packed_on_device"]

PACKINGS = ("documents", "stream")


def pack_documents(x: torch.Tensor, y: torch.Tensor, separator: int):
    """``x``, ``y`` ``(B, L)`` → ``x`` ``(1, B·L)``, ``y`` ``(1, B·L)`` and ``cu_seqlens`` ``(N+1,)`` int64: a new
    sequence at every window start and at every position (but a window's first) whose input is ``separator``."""
    B, L = x.shape
    starts = x == separator  # (B, L)
    starts[:, 0] = True  # every window starts a sequence
    flat = starts.reshape(-1).nonzero().flatten()  # (N,) offsets in the flattened batch
    cu = torch.cat([flat, flat.new_tensor([B * L])]).to(torch.int64)
    return x.reshape(1, B * L), y.reshape(1, B * L), cu


def packed_on_device(cu_seqlens: torch.Tensor, device: torch.device, compiled: bool):
    """The loader's offsets (on the CPU) for the model on ``device``: a ``PackedOffsets`` built from the host values,
    so that the model reads nothing back from the device (one host sync a step less, found on an H100 by the GPU
    check), eager or with its blocks compiled (``CompiledBlocks``: the model hands them the tensor alone);
    ``compiled`` (a module compiled whole, which sees its inputs as they are), the tensor, since a
    ``PackedOffsets``'s host tuple would be a guard that changes with every batch (a recompile a step), marked as of
    a varying length (``dynamic_count``)."""
    if compiled:  # N varies from batch to batch: one graph for every N (dynamic_count), not one per N
        return dynamic_count(to_device(cu_seqlens, device))
    if cu_seqlens.device.type != "cpu":
        return to_device(cu_seqlens, device)
    return PackedOffsets.from_bounds(cu_seqlens.tolist(), device=device, dtype=cu_seqlens.dtype)
