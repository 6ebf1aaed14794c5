"""The mixer table: pattern letter → mixer class and the config fields it is built from.

Every mixer offers the same contract: `forward(x (B, T, d_model), state) -> (y, state)` (parallel / chunk),
`step(x (B, d_model), state) -> (y, state)` (one token), `init_state(batch_size, device=None, dtype=None)` and
states with `nbytes`. A new mixer is one more row here (and its letter in `config.MIXER_LETTERS`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from hybrid import Attention, MultiScaleRetention, VORecurrence

from .config import MIXER_LETTERS, HybridConfig


@dataclass(frozen=True)
class MixerSpec:
    cls: type[nn.Module]
    kwargs: Callable[[HybridConfig], dict]  # the constructor's arguments from the config


MIXERS: dict[str, MixerSpec] = {
    "R": MixerSpec(VORecurrence, lambda c: dict(
        d_model=c.d_model, n_heads=c.n_heads, head_dim=c.resolved_head_dim, conv_width=c.rnn_conv_width,
        r_min=c.rnn_r_min, r_max=c.rnn_r_max, selective=c.rnn_selective,
        selective_gate=c.rnn_selective_gate, rope_base=c.rope_base,
        rope_scaling=c.rope_scaling, phase=c.resolved_rnn_phase, phase_map=c.rnn_phase_map)),
    "A": MixerSpec(Attention, lambda c: dict(
        d_model=c.d_model, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.resolved_head_dim,
        placement=c.rope_placement, rope_base=c.rope_base, rope_scaling=c.rope_scaling, rope_layout=c.rope_layout,
        rotary_dim=c.rotary_dim, window=c.window, shared_kv=c.shared_kv, carope=c.carope, bias=c.attention_bias)),
    "M": MixerSpec(MultiScaleRetention, lambda c: dict(
        d_model=c.d_model, n_heads=c.n_heads, head_dim=c.resolved_head_dim, rope_base=c.rope_base,
        rope_layout=c.rope_layout, norm_eps=c.norm_eps, retention_chunk=c.retention_chunk)),
}
assert set(MIXERS) == set(MIXER_LETTERS), "every pattern letter has one row"


def build_mixer(config: HybridConfig, letter: str) -> nn.Module:
    """The mixer module for one pattern letter."""
    if letter not in MIXERS:
        raise ValueError(f"pattern: expected a mixer letter from {sorted(MIXERS)}, got {letter!r}")
    spec = MIXERS[letter]
    return spec.cls(**spec.kwargs(config))
