"""Rotary outlier analysis: rotary offset features, their bounds, Table 2 and the figures, after Jonasson,
"Rotary Outliers and Rotary Offset Features in Large Language Models".

    layers, notes = hybrid_rotary_layers(model)    # RotaryLayer specs of our HybridLM (or .hf for transformers)
    stats = capture_statistics(hybrid_forward(model), layers, batches)   # streaming hooks, bounded memory
    result = analyze(stats, p_max)                 # per (layer, head, pair): means, φ, Definition 3.1, bounds
                                                   # (a windowed layer: p_max = min(p_max, its window))
    write_outputs(result, "out/", model="name", notes=notes)   # summary.json, channels.npz, report.md, figures

`geometry` holds the formulas (with the sign of eq. (14) derived from `apply_rotary`), `stats` the running
sums, `capture` the hooks, `features` the per-feature results, `table2` the seed's Table 2, `report` /
`figures` the outputs. The adapters: `hybrid_lm` for our models, `hf` for Hugging Face ones (transformers is
imported only when loading a model). `corpus`, `subject` and `cli` make the `hybrid-rope-analyze` command.
See docs/rotary.md.
"""
from .capture import Captured, LayerStats, RotaryLayer, capture_statistics
from .features import RotaryAnalysis, analyze
from .geometry import (
    is_rotary_offset_feature, lower_bound, offset_curve, pair_angle, positional_attention, upper_bound,
)
from .hybrid_lm import CAROPE_NOTE, hybrid_forward, hybrid_rotary_layers
from .report import summary_dict, write_outputs
from .stats import ProjectionStats, circular_std, pairs
from .table2 import DEFAULT_RADII, SEED_TABLE2, table2, table2_markdown

__all__ = [
    "CAROPE_NOTE", "Captured", "DEFAULT_RADII", "LayerStats", "ProjectionStats", "RotaryAnalysis", "RotaryLayer",
    "SEED_TABLE2", "analyze", "capture_statistics", "circular_std", "hybrid_forward", "hybrid_rotary_layers",
    "is_rotary_offset_feature", "lower_bound", "offset_curve", "pair_angle", "pairs", "positional_attention",
    "summary_dict", "table2", "table2_markdown", "upper_bound", "write_outputs",
]
