"""The training loop's parts: checkpoints (``checkpoint``), what a resumed run may change (``resume``), the divergence
policy (``divergence``), AdamW and its schedule (``optim``, ``schedule``), another run's weights (``init_from``,
``saved_model``) and whether a model fits the device (``footprint``)."""
from .checkpoint import CheckpointError, has_checkpoint, load_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "has_checkpoint", "load_checkpoint", "save_checkpoint"]
