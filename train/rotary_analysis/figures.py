"""The seed's figures 1, 2, 5, 8 and 10 as PNG files (matplotlib, Agg backend).

- fig1_max_qk.png: max |q| and |k| per channel across layers (max over heads and tokens), before and after
  rotation. Channels are shown in the half ("sliced") order, first components of the pairs then second ones,
  whatever the model's layout, so the red dashed line separates pair halves and the white one rotary from
  non-rotary channels, as in the seed.
- fig2_angle_std.png: circular angular standard deviation of the keys against key radius, every feature,
  coloured by pair.
- fig5_offset_curves.png: d_i(p) for every pair and D(p) for one head, p = 0 … 1.25 p_max (the layer's p_max:
  its sliding window when that is smaller).
- fig8_radius_phi.png: key radius against φ for the lowest-frequency pairs, one point per (layer, head), with
  the lower bound (dashed) and the relaxed bound (dotted) where the pair is under the upper bound (one pair of
  lines per layer p_max: global and windowed layers have different bounds).
- fig10_positional_attention.png: softmax(D(m − n)/√d_h) over keys n ≤ m for the same head (inside its window).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from hybrid.rotary import rotary_permutation
from .features import RotaryAnalysis
from .geometry import RELAXATION, offset_curve, positional_attention

N_FIG8_PAIRS = 6
FIG10_POSITIONS = 256


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def default_head(result: RotaryAnalysis) -> tuple[int, int]:
    """(layer index, head) holding the largest key radius: the head the figures 5 and 10 show by default."""
    flat = int(result.radius_k.argmax())
    L, H, P = result.radius_k.shape
    return flat // (H * P), (flat // P) % H


def _fig1(result, path, plt):
    perm = rotary_permutation(result.head_dim, result.rotary_dim, src=result.layout, dst="half")
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), squeeze=False)
    for col, name in enumerate(("q", "k")):
        for row, (key, when) in enumerate((("max_abs", "before rotation"), ("max_abs_rotated", "after rotation"))):
            ax = axes[row][col]
            values = result.channels[name][key].amax(dim=1)[:, perm]  # (L, D) in half order
            im = ax.imshow(values.numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
            ax.axvline(result.rotary_dim - 0.5, color="white", ls="--", lw=1)
            ax.axvline(result.rotary_dim / 2 - 0.5, color="red", ls="--", lw=1)
            ax.set_title(f"max |{name}| {when}")
            ax.set_xlabel("channel (pair firsts | pair seconds | non-rotary)")
            ax.set_ylabel("layer")
            ax.set_yticks(range(len(result.layers)), [str(i) for i in result.layers])
            fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig2(result, path, plt):
    fig, ax = plt.subplots(figsize=(7, 5))
    P = result.phi.shape[-1]
    pair = torch.arange(P).expand_as(result.phi)
    sc = ax.scatter(result.radius_k.flatten().numpy(), result.angle_std_k.flatten().numpy(),
                    c=pair.flatten().numpy(), s=6, cmap="viridis")
    fig.colorbar(sc, ax=ax, label="pair i")
    ax.set_xlabel("key radius |k̄_i|")
    ax.set_ylabel("circular angular std of keys (rad)")
    ax.set_title("angular std vs radius (every layer, head, pair)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig5(result, path, plt, head):
    li, h = head
    p_max = result.layer_p_max[li]
    p = torch.arange(0, int(math.ceil(1.25 * p_max)) + 1, dtype=torch.float64)
    d = offset_curve(result.q_mean[li, h], result.k_mean[li, h], result.theta[li, h], p)  # (P, n)
    fig, ax = plt.subplots(figsize=(9, 5))
    for i in range(d.shape[0]):
        ax.plot(p.numpy(), d[i].numpy(), lw=0.8, label=f"d_{i}" if d.shape[0] <= 16 else None)
    ax.plot(p.numpy(), d.sum(0).numpy(), color="black", lw=2, label="D(p)")
    ax.axvline(p_max, color="grey", ls="--", lw=1)
    ax.set_xlabel("relative position p")
    ax.set_ylabel("d_i(p)")
    ax.set_title(f"layer {result.layers[li]}, head {h}: d_i(p) and D(p) (dashed: p_max = {p_max})")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig8_bounds(result, i: int) -> list[float]:
    """Pair i's lower bounds to draw: per distinct layer p_max, the mean bound of those layers when all their
    features are under the upper bound."""
    bounds = []
    for p_max in sorted(set(result.layer_p_max)):
        rows = [li for li, pm in enumerate(result.layer_p_max) if pm == p_max]
        if bool(result.under_upper_bound[rows, :, i].all()):
            bounds.append(float(result.lower_bound[rows, :, i].mean()))
    return bounds


def _fig8(result, path, plt):
    P = result.phi.shape[-1]
    shown = list(range(max(0, P - N_FIG8_PAIRS), P))
    fig, axes = plt.subplots(1, len(shown), figsize=(2.6 * len(shown) + 1.2, 3.6), sharey=True, squeeze=False,
                             layout="constrained")
    L = result.phi.shape[0]
    colors = torch.arange(L)[:, None].expand(L, result.phi.shape[1])
    for ax, i in zip(axes[0], shown):
        sc = ax.scatter(result.phi[..., i].flatten().numpy(), result.radius_k[..., i].flatten().numpy(),
                        c=colors.flatten().numpy(), s=8, cmap="viridis", vmin=0, vmax=max(L - 1, 1))
        for lb in _fig8_bounds(result, i):
            ax.axvline(lb, color="black", ls="--", lw=1)
            ax.axvline(lb - RELAXATION, color="black", ls=":", lw=1)
        ax.set_xlim(0, 2 * math.pi)
        ax.set_title(f"pair {i}, θ={float(result.theta[..., i].mean()):.2e}", fontsize=8)
        ax.set_xlabel("φ_i (rad)")
    axes[0][0].set_ylabel("key radius |k̄_i|")
    fig.colorbar(sc, ax=axes[0].tolist(), label="layer (analysed index)", fraction=0.03, pad=0.01)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig10(result, path, plt, head):
    li, h = head
    T = min(result.p_max, FIG10_POSITIONS)
    p = torch.arange(T, dtype=torch.float64)
    total = offset_curve(result.q_mean[li, h], result.k_mean[li, h], result.theta[li, h], p).sum(0)  # (T,)
    pattern = positional_attention(total, result.head_dim, window=result.windows[li])
    fig, ax = plt.subplots(figsize=(6, 5))
    im = ax.imshow(pattern.numpy(), cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax)
    ax.set_xlabel("key position n")
    ax.set_ylabel("query position m")
    ax.set_title(f"positional attention, layer {result.layers[li]}, head {h}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_figures(result: RotaryAnalysis, out_dir, *, head: tuple[int, int] | None = None) -> dict[str, str]:
    """Write the five PNGs into out_dir; return {title: file name}. head: (layer index, head) for 5 and 10."""
    plt = _plt()
    out = Path(out_dir)
    head = default_head(result) if head is None else head
    L, H, _ = result.phi.shape
    if not (0 <= head[0] < L and 0 <= head[1] < H):
        raise ValueError(f"head: expected (layer index < {L}, head < {H}), got {head}")
    files = {
        "Figure 1: max |q|, |k| per channel": "fig1_max_qk.png",
        "Figure 2: angular std vs radius": "fig2_angle_std.png",
        "Figure 5: d_i(p) and D(p)": "fig5_offset_curves.png",
        "Figure 8: radius vs φ with the lower bounds": "fig8_radius_phi.png",
        "Figure 10: positional attention pattern": "fig10_positional_attention.png",
    }
    names = list(files.values())
    _fig1(result, out / names[0], plt)
    _fig2(result, out / names[1], plt)
    _fig5(result, out / names[2], plt, head)
    _fig8(result, out / names[3], plt)
    _fig10(result, out / names[4], plt, head)
    return files
