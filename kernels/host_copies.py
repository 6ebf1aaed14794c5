"""Host values onto the device without waiting for the GPU.

A copy from the host's ordinary (pageable) memory may wait for every kernel already queued on the stream, even
with ``non_blocking=True``: CUDA stages such a copy through pinned memory, and "the driver may synchronize with the
stream" to do it (the CUDA runtime API's "API synchronization behavior"). The host then cannot queue the next
kernels while the GPU runs these, and ``torch.cuda.set_sync_debug_mode`` does not report it. From pinned memory
the copy is asynchronous; PyTorch's caching host allocator keeps the pinned block until the copy is done. So
values bound for a CUDA device pass through pinned memory first (a host memcpy of a few bytes to a few MB).

Not while ``torch.compile`` traces (the copy is then the graph's, not the host's) or while a CUDA graph is being
captured (a replay would read the pinned block after the allocator has handed it to another copy): there the
plain non-blocking copy is kept."""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["on_device", "to_device"]


def _through_pinned(tensor: Tensor, device: torch.device) -> bool:
    return (device.type == "cuda" and tensor.device.type == "cpu" and not torch.compiler.is_compiling()
            and not tensor.is_pinned() and not torch.cuda.is_current_stream_capturing())


def to_device(tensor: Tensor, device) -> Tensor:
    """``tensor`` on ``device`` by a non-blocking copy; from the host to a CUDA device through pinned memory, so
    that the host does not wait for the queued work (see the module's note). ``tensor`` itself if it is there."""
    device = torch.device(device)
    if _through_pinned(tensor, device):
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def on_device(values, device, dtype=torch.int64) -> Tensor:
    """Host integers (offsets, indices) as a 1-D tensor on ``device``, by ``to_device``: no stream sync
    (``torch.tensor(values, device=…)`` copies and then waits for the stream)."""
    return to_device(torch.tensor(values, dtype=dtype), device)
