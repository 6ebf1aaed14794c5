"""Adapter from our `HybridLM` to the rotary outlier analysis.

`hybrid_rotary_layers(model)` returns one `RotaryLayer` per mixer whose queries and keys are both rotated:

- attention ("A") with placement `qk`, `qkv` or `qkvo` (placements that rotate only one of q, k, or neither,
  have no relative q·k rotation to analyse and are skipped). Pre-rotation q and k are the q and k parts of
  `in_proj`'s output. With `qkvo` the values are rotated too: the q·k analysis still describes where
  attention looks, but not what the rotated values then add (see docs/rotary.md).
- retention ("M"): q and k are rotated as in QK-RoPE, then decayed by γ^(n−m); k is analysed with the
  D^−1/2 scale retention applies before rotating.
- CARoPE attention: the rotation angle is data-dependent, a cumulative sum of per-token increments
  f(x_t)^i. The analysis uses the effective frequency θ̄_i = the corpus mean of the increments (per layer, kv
  head and pair), so d_i(p) = |q̄||k̄| cos(φ_i − θ̄_i p) is the mean-field curve and the bounds apply to θ̄_i;
  the "after rotation" statistics use the true per-token phases.

p_max for our models is the training sequence length (the run's `seq_len`); a windowed attention layer
carries its `window` in its `RotaryLayer`, and `analyze` uses min(seq_len, window) for it.
"""
from __future__ import annotations

import torch

from hybrid.attention import Attention
from hybrid.models.lm import HybridLM
from hybrid.retention import MultiScaleRetention
from hybrid.rotary import inv_freq

from .capture import Captured, RotaryLayer

CAROPE_NOTE = ("CARoPE: rotation angles are data-dependent; θ is the effective frequency (the corpus mean of the "
               "per-token phase increments) and d_i(p), D(p) and the bounds are mean-field approximations.")
QKVO_NOTE = ("values and outputs are rotated too (VO-RoPE): the q·k analysis describes where attention looks, "
             "not the relative rotation R_(j−i) the values then carry.")
RETENTION_NOTE = "retention layers: q·k is further multiplied by the decay γ^(n−m), which D(p) leaves out."


def _attention_layer(index: int, attn: Attention, config) -> RotaryLayer:
    H, G, D, R = attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.rotary_dim

    def extract(module, args, kwargs, output, seen):
        qkv = seen["qkv"]
        q = qkv[..., : H * D].unflatten(-1, (H, D))  # (B, T, H, D)
        k = qkv[..., H * D : (H + G) * D].unflatten(-1, (G, D))  # (B, T, G, D)
        if attn.carope is None:
            return Captured(q=q, k=k)
        x = args[0] if args else kwargs["x"]
        phases, _ = attn.carope(x, None)  # (B, T, G, P), from position 0 as in the hooked call
        return Captured(q=q, k=k, q_angles=phases.repeat_interleave(H // G, dim=2), k_angles=phases,
                        increments=attn.carope.increments(x))

    theta = None if attn.carope is not None else inv_freq(R, config.rotary.base, config.rotary.scaling)[0]
    return RotaryLayer(layer=index, n_heads=H, n_kv_heads=G, head_dim=D, rotary_dim=R, layout=attn.rope_layout,
                       theta=theta, module=attn, extract=extract, sources={"qkv": attn.in_proj}, window=attn.window)


def _retention_layer(index: int, ret: MultiScaleRetention) -> RotaryLayer:
    H, D = ret.n_heads, ret.head_dim

    def extract(module, args, kwargs, output, seen):
        q = seen["q"].unflatten(-1, (H, D))  # (B, T, H, D)
        k = seen["k"].unflatten(-1, (H, D)) * D**-0.5  # (B, T, H, D), scaled as retention does
        return Captured(q=q, k=k)

    # θ from the config, as the layer rotates with it: its inv_freq buffer is cast with the model (bfloat16 rounds
    # it by up to 0.4 %, half a radian at position 256 for the fastest pair)
    rotary = ret.rotary
    theta = inv_freq(rotary.rotary_dim, rotary.base, rotary.scaling)[0]
    return RotaryLayer(layer=index, n_heads=H, n_kv_heads=H, head_dim=D, rotary_dim=rotary.rotary_dim,
                       layout=ret.rope_layout, theta=theta, module=ret, extract=extract,
                       sources={"q": ret.q_proj, "k": ret.k_proj})


def hybrid_rotary_layers(model: HybridLM, *, include_retention: bool = False) -> tuple[list[RotaryLayer], list[str]]:
    """The mixers of `model` whose q and k are rotated, and notes on what the analysis means for them.

    Retention layers are left out unless `include_retention` (their scores also decay with distance); a model
    is analysed one mixer kind at a time, as the features of both kinds would differ in shape and meaning.
    """
    layers, notes = [], []
    for i, block in enumerate(model.blocks):
        mixer = block.mixer
        if isinstance(mixer, Attention) and mixer.placement.q and mixer.placement.k:
            layers.append(_attention_layer(i, mixer, model.config))
            if mixer.carope is not None and CAROPE_NOTE not in notes:
                notes.append(CAROPE_NOTE)
            if mixer.placement.v and QKVO_NOTE not in notes:
                notes.append(QKVO_NOTE)
        elif include_retention and isinstance(mixer, MultiScaleRetention):
            layers.append(_retention_layer(i, mixer))
            if RETENTION_NOTE not in notes:
                notes.append(RETENTION_NOTE)
    if not layers:
        raise NoRotaryLayers(model.config.pattern, model.config.attention.placement,
                             retention=not include_retention and "M" in model.config.pattern)
    return layers, notes


class NoRotaryLayers(ValueError):
    """A model with no layer to analyse; ``retention``: it has retention layers, left out. ``message(model,
    option)`` names the model and the option that adds them as the caller's user typed them (the CLI: ``MODEL``
    and ``--include-retention``); ``str()`` names the Python arguments."""

    def __init__(self, pattern: str, placement: str, *, retention: bool):
        self.pattern, self.placement, self.retention = pattern, placement, retention
        super().__init__(self.message())

    def message(self, model: str = "model", option: str = "include_retention=True") -> str:
        return (f"{model}: expected attention layers rotating q and k (pattern {self.pattern!r}, rope_placement "
                f"{self.placement!r}), got none" + (f"; retention layers need {option}" if self.retention else ""))


def hybrid_forward(model: HybridLM):
    """A `forward(batch)` for `capture_statistics`: one parallel pass from position 0."""
    def forward(ids: torch.Tensor):
        return model(ids.to(next(model.parameters()).device))
    return forward
