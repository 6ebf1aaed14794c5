"""Capturing pre-rotation queries and keys with forward hooks while a model reads a corpus, streaming.

A model adapter describes each attention layer that rotates q and k by a `RotaryLayer`: the attention module to
hook, optional `sources` (named sub-modules, e.g. `q_proj`, whose outputs are kept for the call) and an
`extract(module, args, kwargs, output, seen) -> Captured` (`seen`: source name -> its output during this call)
that returns that layer's pre-rotation q `(B, T, H, D)` and k `(B, T, G, D)` (G = kv heads; query head h
reads kv head h // (H/G)). Each batch is a fresh sequence at positions 0 … T − 1, so the rotation is `t·θ_i`
unless the adapter returns its own angles (CARoPE: the data-dependent phases, plus the per-token increments
whose mean becomes the feature's effective θ).

`capture_statistics(forward, layers, batches)` runs `forward(batch)` under `torch.no_grad()` for every batch,
with a tqdm bar over tokens, and returns one `LayerStats` per layer. Only running sums are kept: memory is
O(layers · heads · head_dim), whatever the number of tokens.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from hybrid.checks import check_int
from hybrid.rotary import cos_sin_from_angles, rotary_angles
from .stats import ProjectionStats


@dataclass
class Captured:
    """One layer's pre-rotation q `(B, T, H, D)` and k `(B, T, G, D)`; optional per-token angles
    `(B, T, H, P)` / `(B, T, G, P)` and phase increments `(B, T, G, P)` (data-dependent rotary only)."""

    q: torch.Tensor
    k: torch.Tensor
    q_angles: torch.Tensor | None = None
    k_angles: torch.Tensor | None = None
    increments: torch.Tensor | None = None


@dataclass
class RotaryLayer:
    """An attention layer whose q and k are rotated: its shapes, layout, frequencies and how to read q, k.

    theta: `(P,)` frequencies after any scaling (float64), or None when the adapter supplies angles.
    window: a sliding window w (each query attends its w latest tokens, itself included), None: global. The
    bounds of a windowed layer use p_max = min(p_max, w): distances past the window are never scored.
    """

    layer: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary_dim: int
    layout: str
    theta: torch.Tensor | None
    module: nn.Module
    extract: Callable[..., Captured]
    sources: dict = field(default_factory=dict)
    window: int | None = None

    def __post_init__(self):
        self.window = check_int("window", self.window, low=1, allow_none=True, what="a positive int")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads={self.n_heads}, got {self.n_kv_heads}")
        if self.theta is not None:
            self.theta = torch.as_tensor(self.theta, dtype=torch.float64).cpu()
            if self.theta.shape != (self.rotary_dim // 2,):
                raise ValueError(f"theta: expected shape ({self.rotary_dim // 2},), got {tuple(self.theta.shape)}")


@dataclass
class LayerStats:
    """The statistics of one `RotaryLayer` after a corpus pass.

    theta: `(G, P)` float64, the static frequencies, or the mean per-token phase increment (CARoPE).
    """

    spec: RotaryLayer
    q: ProjectionStats
    k: ProjectionStats
    increment_sum: torch.Tensor | None = None
    increment_count: int = 0

    @property
    def theta(self) -> torch.Tensor:
        G, P = self.spec.n_kv_heads, self.spec.rotary_dim // 2
        if self.spec.theta is not None:
            return self.spec.theta.expand(G, P).clone()
        if self.increment_sum is None:
            raise ValueError(f"layer {self.spec.layer}: no frequencies (theta is None and nothing was captured)")
        return self.increment_sum / max(self.increment_count, 1)


def _new_stats(spec: RotaryLayer) -> LayerStats:
    return LayerStats(spec=spec,
                      q=ProjectionStats(spec.n_heads, spec.head_dim, spec.rotary_dim, spec.layout),
                      k=ProjectionStats(spec.n_kv_heads, spec.head_dim, spec.rotary_dim, spec.layout))


def _update(stats: LayerStats, got: Captured) -> None:
    spec = stats.spec
    T = got.q.shape[1]
    if got.q_angles is None:
        if spec.theta is None:
            raise ValueError(f"layer {spec.layer}: the adapter gave neither theta nor per-token angles")
        angles = rotary_angles(torch.arange(T, device=got.q.device), spec.theta)  # (T, P) float64
        cos_q = cos_k = torch.cos(angles)
        sin_q = sin_k = torch.sin(angles)
    else:
        cos_q, sin_q = cos_sin_from_angles(got.q_angles.double(), torch.float64)
        cos_k, sin_k = cos_sin_from_angles(got.k_angles.double(), torch.float64)
    stats.q.update(got.q, cos_q, sin_q)
    stats.k.update(got.k, cos_k, sin_k)
    if got.increments is not None:
        inc = got.increments.detach().double().flatten(0, 1)  # (B·T, G, P)
        stats.increment_sum = inc.sum(0).cpu() + (0 if stats.increment_sum is None else stats.increment_sum)
        stats.increment_count += inc.shape[0]


def capture_statistics(forward: Callable[[torch.Tensor], object], layers: list[RotaryLayer],
                       batches: Iterable[torch.Tensor], *, total_tokens: int | None = None,
                       progress: bool = True, desc: str = "corpus") -> list[LayerStats]:
    """Run `forward(batch)` for each batch `(B, T)` of token ids and return the statistics of every layer."""
    if not layers:
        raise ValueError("layers: expected at least one attention layer that rotates q and k, got none")
    from tqdm.auto import tqdm

    stats = [_new_stats(spec) for spec in layers]
    handles = []
    for s in stats:
        seen: dict = {}
        for name, source in s.spec.sources.items():
            def keep(module, args, output, name=name, seen=seen):
                seen[name] = output
            handles.append(source.register_forward_hook(keep))

        def hook(module, args, kwargs, output, s=s, seen=seen):
            try:
                _update(s, s.spec.extract(module, args, kwargs, output, seen))
            finally:
                seen.clear()
        handles.append(s.spec.module.register_forward_hook(hook, with_kwargs=True))
    bar = tqdm(total=total_tokens, unit="tok", desc=desc, disable=not progress, unit_scale=True)
    try:
        with torch.no_grad():
            for batch in batches:
                forward(batch)
                bar.update(batch.numel())
    finally:
        bar.close()
        for h in handles:
            h.remove()
    if stats[0].q.count == 0:
        raise ValueError("batches: expected at least one token, got an empty corpus")
    return stats
