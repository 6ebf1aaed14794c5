"""The one training loop and its parts: every run kind (a language model, a distillation's stages, a synthetic task)
trains through ``TrainingLoop`` and says what differs as a ``Stage``.

- ``loop``: the loop (the optimizer step, the cadence of records, evaluations and checkpoints, exact resume);
- ``stage``: the hooks a run kind gives (what a step computes, how validation scores, which parameters train);
- ``run``: what every run kind's ``fit()`` shares (joining the device and the job, closing down);
- ``parts``, ``checkpoint``, ``rng``: the checkpoint as named stateful parts, its atomic files, the RNG states;
- ``divergence``: the non-finite policy; ``resume``: what a resumed run may change;
- ``optim``, ``schedule``: AdamW and its warmup-cosine; ``init_from``, ``saved_model``: another run's weights;
  ``footprint``: whether a model fits the device before it is built.
"""
from .checkpoint import CheckpointError, has_checkpoint, load_checkpoint, save_checkpoint
from .loop import Cadence, TrainingLoop
from .stage import Stage

__all__ = ["TrainingLoop", "Cadence", "Stage", "CheckpointError", "has_checkpoint", "load_checkpoint",
           "save_checkpoint"]
