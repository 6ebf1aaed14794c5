"""Training: data, tokenizers, the trainer (single process, DDP, FSDP2), checkpoints, CLI, demo.

    from hybrid.train import TrainConfig, Trainer
    result = Trainer(TrainConfig(steps=500, out="runs/x")).fit()      # fresh run
    result = Trainer.from_checkpoint("runs/x", steps=1000).fit()      # exact resume, new total

Command lines: ``hybrid-train`` (``python -m hybrid.train``), ``hybrid-generate``; ``python -m hybrid.train.demo``.
"""
from .loop.checkpoint import CheckpointError, has_checkpoint, load_checkpoint, save_checkpoint
from .lm.config import TrainConfig
from .lm.evaluate import evaluate
from .lm.inference import LoadedRun, generate_ids, generate_text, load_run
from .loop.optim import build_optimizer, param_groups
from .lm.trainer import Trainer, TrainResult, model_config_for, train

__all__ = [
    "TrainConfig", "Trainer", "TrainResult", "train", "model_config_for", "evaluate",
    "build_optimizer", "param_groups",
    "load_run", "LoadedRun", "generate_text", "generate_ids",
    "CheckpointError", "load_checkpoint", "save_checkpoint", "has_checkpoint",
]
