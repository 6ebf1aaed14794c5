"""``--init-from RUN_DIR``: start a new run from another run's weights (not its optimizer, data position or step).

The new run's model is the source run's ``HybridConfig`` with ``TrainConfig.model`` overrides on top (they must
keep every weight's shape, e.g. ``window``); its tokenizer is the source run's unless one is given. Any run
directory works, including one written by ``hybrid-import`` (a Llama / Mistral / Qwen2 checkpoint).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.models import HybridConfig

from .checkpoint import CheckpointError, load_checkpoint


@dataclass
class InitWeights:
    config: HybridConfig
    model_state: dict[str, torch.Tensor]
    tokenizer: str | None  # for TrainConfig.tokenizer: None (bytes) or the path of a tokenizer.json


def load_init(run_dir) -> InitWeights:
    """The model config, weights and tokenizer spec of the checkpoint in ``run_dir``."""
    ckpt = load_checkpoint(run_dir)
    try:
        config = HybridConfig.from_dict(ckpt.config)
    except ValueError as e:
        raise CheckpointError(ckpt.path / "config.json", f"is not a valid model config ({e})") from None
    record = (ckpt.extra or {}).get("tokenizer", {}) if isinstance(ckpt.extra, dict) else {}
    tokenizer = record.get("path") if record.get("kind") == "tokenizers" else None
    return InitWeights(config=config, model_state=ckpt.model_state, tokenizer=tokenizer)
