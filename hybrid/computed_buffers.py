"""Buffers a module computes from its options (rotary frequencies, a schedule's angles), kept on the host as well.

A model built on the meta device (``with torch.device("meta"): HybridLM(config)``, FSDP2's way to build a model
larger than one device) has no values in its buffers, and ``to_empty`` leaves them uninitialised: they are not in
the state dict, so loading one does not restore them. Each such buffer is computed on the host whatever the
default device, registered on the default device, and its host value kept, so that ``restore_computed_buffers``
writes it back after ``to_empty``. A module holding such buffers derives from ``WithComputedBuffers``, which does so
after every move or cast of it (``to``, ``half``, ``to_empty``), in any model: a buffer is a function of the
module's options alone, so an edit of it survives neither a move nor a save (angles of one's own are a
parameter: ``recurrence.phase="learned"``).
"""
from __future__ import annotations

import torch
from torch import nn


def on_host():
    """The context to compute a buffer's value in: the host, under any default device (meta, CUDA)."""
    return torch.device("cpu")


def default_device() -> torch.device:
    """Where factory functions put tensors now (``torch.device(...)`` context or ``torch.set_default_device``)."""
    return torch.empty(0).device


def register_computed_buffer(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Register ``value`` (computed on the host) as ``module``'s non-persistent buffer ``name``, on the default
    device, and keep its host value for ``restore_computed_buffers``."""
    if value.device.type != "cpu":
        raise ValueError(f"value: expected a tensor computed on the host (`on_host()`), got one on {value.device}")
    computed = module.__dict__.setdefault("_computed_buffers", {})
    computed[name] = value.detach().clone()  # its own copy: the caller may change the tensor it passed
    module.register_buffer(name, value.to(default_device(), copy=True), persistent=False)


@torch.no_grad()
def _restore_own(module: nn.Module) -> None:
    for name, value in module.__dict__.get("_computed_buffers", {}).items():
        getattr(module, name).copy_(value)  # in place: cast to the buffer's dtype, on its device


def restore_computed_buffers(model: nn.Module) -> None:
    """Write every computed buffer of ``model`` and its submodules back from its host value, in place (cast to the
    buffer's dtype, on its device): whenever their values are in doubt."""
    for module in model.modules():
        _restore_own(module)


class WithComputedBuffers(nn.Module):
    """A module whose computed buffers are written back after every move or cast of it: never left uninitialised by
    ``to_empty``, never left rounded by a cast to bfloat16 and back (the R layers' angles were, until 2026-11-28).
    The buffers named in ``float32_buffers`` (angles) stay float32 when the module is cast to float16 / bfloat16."""

    float32_buffers: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name in self.float32_buffers:
            buf = self._buffers.get(name)  # None when it is a parameter (learned angles) or absent
            if buf is not None and buf.dtype in (torch.float16, torch.bfloat16):
                self._buffers[name] = torch.empty(buf.shape, device=buf.device, dtype=torch.float32)
        _restore_own(self)
        return self
