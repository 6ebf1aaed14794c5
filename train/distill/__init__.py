"""``hybrid-distill``: a trained Transformer (ours, or imported with hybrid-import) turned into a hybrid.

    from hybrid.train.distill import DistillConfig, Distiller
    result = Distiller(DistillConfig(teacher="runs/tf", pattern="RRA", model={"window": 64}, out="runs/rra")).fit()

- ``mapping``: the student's config and weights; each R layer from the V and O of the attention it replaces.
- ``losses``: stage 1's per-layer MSE on the teacher's inputs, stage 2's KL(teacher ‖ student) (+ cross-entropy).
- ``select``: ``--keep-attention auto:K``, the layers whose replacement costs the most KL stay attention.
- ``teacher``: the frozen teacher from any run directory; ``plot``: the run's loss.png of both stages.
- ``run``: the run directory, checkpoints, exact resume; ``cli``: the command line. docs/distill.md explains it.
"""
from .config import DistillConfig
from .losses import alignment_losses, capture_mixer_io, distill_loss, token_kl
from .mapping import decay_from_attention, init_student, layer_types_for_pattern, recurrence_from_attention
from .run import Distiller, DistillResult
from .select import keep_most_costly, replacement_costs
from .teacher import load_teacher

__all__ = ["DistillConfig", "Distiller", "DistillResult", "load_teacher", "recurrence_from_attention", "init_student",
           "layer_types_for_pattern", "decay_from_attention", "distill_loss", "token_kl", "alignment_losses",
           "capture_mixer_io",
           "replacement_costs", "keep_most_costly"]
