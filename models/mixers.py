"""The mixer table: the one place a mixer is declared. Pattern letter → (config section, mixer class).

A row `"R": MixerRow("recurrence", VORecurrence)` makes "R" a pattern letter, gives `HybridConfig` a section
`config.recurrence` holding a `VORecurrence.Config` (filled with its defaults, checked against the stack's shape
when the pattern uses the letter), and builds each "R" layer as

    VORecurrence(d_model, n_heads, head_dim, rotary=config.rotary, norm_eps=config.norm_eps,
                 config=config.recurrence)

Every mixer follows `hybrid.mixer.Mixer`: `forward(x (B, T, d_model), state, *, offset) -> (y, state)` (parallel /
chunk), `step(x (B, d_model), state, offset) -> (y, state)` (one token; `offset`: the position, kept by the
caller), `init_state(batch_size, device=None, dtype=None)`, states with `nbytes`, `clone()` and `cat`, and a
`Config` declaring `state_grows` and `cheap_to_recompute`.
A new mixer is one file (the class and its `Config`) and one row here.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid import Attention, MultiScaleRetention, VOGatedLinearAttention, VORecurrence
from hybrid.mixer import Mixer


@dataclass(frozen=True)
class MixerRow:
    name: str  # the config section holding its options: HybridConfig.<name>
    cls: type[Mixer]  # the mixer; cls.Config is its options dataclass


MIXERS: dict[str, MixerRow] = {
    "R": MixerRow("recurrence", VORecurrence),
    "A": MixerRow("attention", Attention),
    "M": MixerRow("retention", MultiScaleRetention),
    "G": MixerRow("gla", VOGatedLinearAttention),
}


def mixer_row(letter: str) -> MixerRow:
    """The table row of a pattern letter."""
    if letter not in MIXERS:
        raise ValueError(f"pattern: expected a mixer letter from {sorted(MIXERS)}, got {letter!r}")
    return MIXERS[letter]


def build_mixer(config, letter: str) -> Mixer:
    """The mixer module for one pattern letter of a ``HybridConfig``."""
    row = mixer_row(letter)
    return row.cls(config.d_model, config.n_heads, config.resolved_head_dim, rotary=config.rotary,
                   norm_eps=config.norm_eps, config=config.section(row.name))
