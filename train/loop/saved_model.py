"""The model saved in a checkpoint: its HybridConfig and its weights, checked as they are read.

    ckpt = load_checkpoint("runs/x")
    model = checkpoint_model(ckpt, device="cuda")      # HybridLM in eval mode, the checkpoint's weights
    config = checkpoint_config(ckpt)                   # only the config (``--init-from`` builds its own model)

Every reader of a run directory goes through these two (``load_run``, ``load_task_run``, ``--init-from``,
``hybrid-distill``'s teacher), so a bad config or weights that do not fit read the same everywhere:
``CheckpointError("checkpoint file …/config.json: is not a valid model config (…)")`` and
``CheckpointError("checkpoint file …: weights do not fit the model config (…)")``.
"""
from __future__ import annotations

import torch

from hybrid.models import HybridConfig, HybridLM

from .checkpoint import Checkpoint, CheckpointError

__all__ = ["checkpoint_config", "checkpoint_model"]


def checkpoint_config(ckpt: Checkpoint) -> HybridConfig:
    """The checkpoint's model config (old flat config files upgrade through ``HybridConfig.from_dict``)."""
    try:
        return HybridConfig.from_dict(ckpt.config)
    except ValueError as e:
        raise CheckpointError(ckpt.path / "config.json", f"is not a valid model config ({e})") from None


def checkpoint_model(ckpt: Checkpoint, device: str | torch.device = "cpu",
                     config: HybridConfig | None = None) -> HybridLM:
    """The checkpoint's model with its weights, in eval mode on ``device``; ``config`` when already read. Built on
    the meta device and given memory on ``device`` alone: no random initialisation to draw and overwrite, no copy
    of the model on the host."""
    with torch.device("meta"):
        model = HybridLM(checkpoint_config(ckpt) if config is None else config)
    model.to_empty(device=device)  # uninitialised weights; the buffers computed from the config set
    try:
        model.load_state_dict(ckpt.model_state)  # strict: every weight present, every shape right
    except RuntimeError as e:
        raise CheckpointError(ckpt.path, f"weights do not fit the model config ({e})") from None
    return model.eval()
