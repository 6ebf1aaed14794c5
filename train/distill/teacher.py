"""The teacher of a distillation: any run directory (hybrid-train, hybrid-import or hybrid-distill), loaded frozen.

    teacher = load_teacher("runs/tf", device)     # teacher.model: a HybridLM in eval mode, no gradients
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybrid.models import HybridConfig, HybridLM

from ..loop.checkpoint import CheckpointError, load_checkpoint
from ..loop.saved_model import checkpoint_config, checkpoint_model

@dataclass
class Teacher:
    model: HybridLM
    config: HybridConfig
    tokenizer: dict  # the checkpoint's tokenizer record
    path: Path  # the run directory
    sha256: str  # of its model.safetensors: a resumed run checks that the teacher did not change


def load_teacher(run_dir, device) -> Teacher:
    """The teacher's model (frozen, eval mode), config and tokenizer record; a ValueError naming --teacher when
    ``run_dir`` is not a run directory, or its checkpoint has no tokenizer record."""
    path = Path(run_dir)
    try:
        ckpt = load_checkpoint(path)
    except FileNotFoundError as e:
        raise ValueError(f"--teacher: expected a run directory (with checkpoint/), got {run_dir} ({e})") from None
    except CheckpointError as e:
        raise ValueError(f"--teacher: expected a readable run directory, got {run_dir} ({e})") from None
    extra = ckpt.extra if isinstance(ckpt.extra, dict) else {}
    if not isinstance(extra.get("tokenizer"), dict):
        raise ValueError(f"--teacher: expected a checkpoint with a tokenizer record (written by hybrid-train, "
                         f"hybrid-import or hybrid-distill), got {ckpt.path}, which has none: the student's vocabulary "
                         f"could not be checked against the data")
    try:
        config = checkpoint_config(ckpt)
        if config.dtype == "float16":
            raise ValueError("expected a float32 or bfloat16 model, got float16 (no loss scaling here); import it "
                             "with hybrid-import --dtype float32")
        model = checkpoint_model(ckpt, device, config).requires_grad_(False)
    except ValueError as e:  # CheckpointError included: a config or weights that do not fit
        raise ValueError(f"--teacher: {' '.join(str(e).split())[:400]}") from None
    sha = ckpt.manifest.get("files", {}).get("model.safetensors", {}).get("sha256", "")
    root = ckpt.path.parent if ckpt.path.name.startswith("checkpoint") else ckpt.path
    return Teacher(model=model, config=config, tokenizer=extra["tokenizer"], path=root.resolve(), sha256=sha)
