"""Per-feature results of a corpus pass: `analyze(stats, p_max) -> RotaryAnalysis`.

A feature is (layer, query head, pair); with GQA/MQA the keys of kv head h // (H/G) are repeated for every query
head that reads them, as the seed does for DeepSeek-V2-Lite, so there are layers × H × P features.

p_max is per layer: `p_max` for a global layer, `min(p_max, w)` for a layer with a sliding window w
(`RotaryLayer.window`), whose queries never score a key w or more tokens back. Like a global layer's training
length, w counts the tokens a query sees, one more than its largest distance.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.checks import check_int

from .capture import LayerStats
from .geometry import RELAXATION, above, is_rotary_offset_feature, lower_bound, pair_angle, upper_bound


@dataclass
class RotaryAnalysis:
    """Every per-feature quantity, as tensors over (layer, head, pair) `(L, H, P)` (float64 / bool).

    p_max: the context length asked for; layer_p_max: the p_max each analysed layer's bounds and Definition 3.1
    use, min(p_max, window); windows: each layer's sliding window (None: global). layers: the model's block
    index of each analysed layer. q_mean, k_mean: `(L, H, P, 2)` pre-rotation means (keys repeated per query
    head). channels: per-channel `(L, H|G, D)` statistics for "q" and "k" (see `ProjectionStats.channel_summary`).
    """

    p_max: int
    layer_p_max: list[int]
    windows: list[int | None]
    head_dim: int
    rotary_dim: int
    layout: str
    n_kv_heads: int
    layers: list[int]
    theta: torch.Tensor
    q_mean: torch.Tensor
    k_mean: torch.Tensor
    phi: torch.Tensor
    is_rof: torch.Tensor
    under_upper_bound: torch.Tensor
    lower_bound: torch.Tensor
    meets_lower_bound: torch.Tensor
    meets_relaxed_lower_bound: torch.Tensor
    angle_std_q: torch.Tensor
    angle_std_k: torch.Tensor
    channels: dict
    tokens: int
    theta_is_effective: bool = False

    @property
    def radius_q(self) -> torch.Tensor:
        return self.q_mean.norm(dim=-1)

    @property
    def radius_k(self) -> torch.Tensor:
        return self.k_mean.norm(dim=-1)

    @property
    def n_features(self) -> int:
        return self.phi.numel()


def _stack(per_layer: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(per_layer, dim=0)


def layer_p_max(p_max: int, window: int | None) -> int:
    """The p_max of one layer: the context length, or a smaller sliding window (the most tokens a query sees)."""
    return p_max if window is None else min(p_max, window)


def _per_layer(fn, tensors: list[torch.Tensor], p_maxes: list[int]) -> torch.Tensor:
    """`fn(tensor[l], …, p_max_l)` for each layer l, stacked: the bounds with each layer's own p_max."""
    return _stack([fn(*(t[li] for t in tensors), pm) for li, pm in enumerate(p_maxes)])


def analyze(stats: list[LayerStats], p_max: int) -> RotaryAnalysis:
    """Combine the layers' statistics into per-feature quantities for context length `p_max` (a windowed
    layer: `min(p_max, window)`, see `layer_p_max`)."""
    if not stats:
        raise ValueError("stats: expected the statistics of at least one layer, got none")
    first = stats[0].spec
    shape = (first.n_heads, first.n_kv_heads, first.head_dim, first.rotary_dim, first.layout)
    for s in stats[1:]:
        got = (s.spec.n_heads, s.spec.n_kv_heads, s.spec.head_dim, s.spec.rotary_dim, s.spec.layout)
        if got != shape:
            raise ValueError(f"stats: expected every layer shaped (H, G, D, R, layout) = {shape}, layer "
                             f"{s.spec.layer} has {got}")
    H, G = first.n_heads, first.n_kv_heads
    rep = H // G
    q_mean = _stack([s.q.mean_pairs() for s in stats])  # (L, H, P, 2)
    k_mean = _stack([s.k.mean_pairs().repeat_interleave(rep, dim=0) for s in stats])  # (L, H, P, 2)
    theta = _stack([s.theta.repeat_interleave(rep, dim=0) for s in stats])  # (L, H, P)
    phi = pair_angle(q_mean, k_mean)
    p_max = check_int("p_max", p_max, low=1, what="a positive int (the context length)")
    windows = [s.spec.window for s in stats]
    p_maxes = [layer_p_max(p_max, w) for w in windows]
    under = _per_layer(upper_bound, [theta], p_maxes)
    lb = _per_layer(lower_bound, [theta], p_maxes)
    channels = {name: {key: _stack([getattr(s, name).channel_summary()[key] for s in stats])
                       for key in ("mean_abs", "max_abs", "mean_abs_rotated", "max_abs_rotated")}
                for name in ("q", "k")}
    return RotaryAnalysis(
        p_max=p_max, layer_p_max=p_maxes, windows=windows, head_dim=first.head_dim, rotary_dim=first.rotary_dim,
        layout=first.layout, n_kv_heads=G, layers=[s.spec.layer for s in stats], theta=theta, q_mean=q_mean,
        k_mean=k_mean, phi=phi, is_rof=_per_layer(is_rotary_offset_feature, [q_mean, k_mean, theta], p_maxes),
        under_upper_bound=under, lower_bound=lb, meets_lower_bound=under & above(phi, lb),
        meets_relaxed_lower_bound=under & above(phi, lb - RELAXATION),
        angle_std_q=_stack([s.q.angle_std() for s in stats]),
        angle_std_k=_stack([s.k.angle_std().repeat_interleave(rep, dim=0) for s in stats]),
        channels=channels, tokens=stats[0].q.count, theta_is_effective=first.theta is None,
    )
