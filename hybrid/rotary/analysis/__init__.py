"""Rotary outlier analysis (seed 003): rotary offset features, their bounds, Table 2 and the figures.

    layers = ...                                   # RotaryLayer specs from an adapter (models/, or .hf)
    stats = capture_statistics(forward, layers, batches)   # streaming hooks, bounded memory
    result = analyze(stats, p_max)                 # per (layer, head, pair): means, φ, Definition 3.1, bounds
    write_outputs(result, "out/", model="name")    # summary.json, channels.npz, report.md, figures

`geometry` holds the formulas (with the sign of eq. (14) derived from `apply_rotary`), `stats` the running
sums, `capture` the hooks, `features` the per-feature results and Table 2, `report` / `figures` the outputs,
`hf` the Hugging Face adapter (transformers is imported only when loading a model). See docs/rotary.md.
"""
from .capture import Captured, LayerStats, RotaryLayer, capture_statistics
from .features import DEFAULT_RADII, SEED_TABLE2, RotaryAnalysis, analyze, table2
from .geometry import (
    is_rotary_offset_feature, lower_bound, offset_curve, pair_angle, positional_attention, upper_bound,
)
from .report import summary_dict, table2_markdown, write_outputs
from .stats import ProjectionStats, circular_std, pairs

__all__ = [
    "Captured", "DEFAULT_RADII", "LayerStats", "ProjectionStats", "RotaryAnalysis", "RotaryLayer", "SEED_TABLE2",
    "analyze", "capture_statistics", "circular_std", "is_rotary_offset_feature", "lower_bound", "offset_curve",
    "pair_angle", "pairs", "positional_attention", "summary_dict", "table2", "table2_markdown", "upper_bound",
    "write_outputs",
]
