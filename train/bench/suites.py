"""The four suites of ``hybrid-bench``, as data: each model a HybridConfig preset plus overrides.

Every model of a suite is then sized to the suite's reference (the first model at the budget's d_model) by
``match_width``: equal non-embedding parameters within ±5%. ``"window"`` in an override stands for the
budget's window; ``"seq_len"`` for its training length.

- ``baselines``: the Transformer (global, QK-RoPE), a sliding-window one, RetNet, the VO-RNN (static and
  selective decay), the hybrid (RRA, window; static and selective decay) and a RetNet-attention hybrid (MMA,
  same window), and the G mixer (VO-RoPE gated linear attention) alone and in a GGA hybrid (issue 46). At the
  ``long`` budget: ``--models transformer,transformer-window,hybrid,hybrid-selective`` (and ``hybrid-gla``).
- ``placements`` (Su's VO-RoPE post, "Experimental Results"): the global Transformer with each of the nine
  rotary placements; the seed's validation losses go beside ours, with the Spearman rank correlation.
- ``positions`` (the CARoPE paper, Veisi et al., Table 1): RoPE, CARoPE, learned and sinusoidal absolute
  positions, at the training length and at 2×; the seed's GPT-Tiny perplexities go beside ours.
- ``extension`` (the RoPE context-extension note: PI, NTK, YaRN …): the global QK-RoPE Transformer at 2×, 4×,
  8× its training length under each context-extension scaling, without fine-tuning, and after a short fine-tune at 2× (PI and YaRN, and without
  scaling as the control: the same extra training at 2L).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Suite", "SUITES", "SCALINGS", "FINETUNES", "scaling_for", "PLACEMENT_SEED_LOSS", "POSITIONS_SEED_PPL"]


@dataclass(frozen=True)
class Suite:
    name: str
    models: dict  # model name -> {"preset": ..., **HybridConfig overrides}, in report order
    factors: tuple[int, ...] = (2, 4, 8)  # evaluation lengths, in training lengths
    about: str = ""
    seed_source: str | None = None


BASELINES = Suite(
    "baselines",
    {
        "transformer": {"preset": "transformer"},
        "transformer-window": {"preset": "transformer", "window": "window"},
        "retnet": {"preset": "retnet"},
        "vo-rnn": {"preset": "vo-rnn"},
        "vo-rnn-selective": {"preset": "vo-rnn", "rnn_selective": True},
        "hybrid": {"preset": "hybrid", "pattern": "RRA", "window": "window"},
        "hybrid-selective": {"preset": "hybrid", "pattern": "RRA", "window": "window", "rnn_selective": True},
        "retnet-hybrid": {"preset": "hybrid", "pattern": "MMA", "window": "window"},
        "vo-gla": {"preset": "vo-gla"},
        "hybrid-gla": {"preset": "hybrid", "pattern": "GGA", "window": "window"},
    },
    about="The hybrids against a Transformer and RetNet of the same non-embedding size, data and schedule.",
)

# the VO-RoPE post's table, in its order (best first); the key is our rope_placement
PLACEMENT_SEED_LOSS = {"qk": 2.712, "qkvo": 2.719, "k": 2.769, "vo": 2.770, "qkv": 2.783, "none": 2.795,
                       "o": 2.841, "q": 2.851, "v": 2.856}
PLACEMENTS = Suite(
    "placements",
    {("nope" if p == "none" else p): {"preset": "transformer", "rope_placement": p} for p in PLACEMENT_SEED_LOSS},
    about="The global Transformer with rotary on each subset of q, k, v, o that the VO-RoPE post tabulates.",
    seed_source="seed 001_de1664ba02918a59, 'Experimental Results' (validation loss)",
)

# the CARoPE paper, Table 1, GPT-Tiny: perplexity at the training length 512 and at 1024 (None: not reported)
POSITIONS_SEED_PPL = {"rope": (29.33, 81.27), "carope": (28.99, 36.74), "learned": (30.48, None),
                      "sinusoidal": (30.62, 223.28)}
POSITIONS = Suite(
    "positions",
    {
        "rope": {"preset": "transformer"},
        "carope": {"preset": "transformer", "carope": True},
        "learned": {"preset": "transformer", "rope_placement": "none", "abs_pos": "learned",
                    "abs_pos_max_len": "seq_len"},
        "sinusoidal": {"preset": "transformer", "rope_placement": "none", "abs_pos": "sinusoidal"},
    },
    factors=(2,),
    about="Rotary against context-aware rotary and absolute position embeddings (learned, sinusoidal).",
    seed_source="seed 004_e829c00abc9a8dcc, Table 1, GPT-Tiny (perplexity, GPT-2 tokens, FineWeb-Edu)",
)

EXTENSION = Suite(
    "extension",
    {"transformer": {"preset": "transformer"}},
    about="The trained global QK-RoPE Transformer read at 2×, 4×, 8× its training length under each scaling.",
    seed_source="seed 002_493bf8895c288894",
)

SUITES = {s.name: s for s in (BASELINES, PLACEMENTS, POSITIONS, EXTENSION)}

# context-extension methods (hybrid.rotary.inv_freq's HF rope_scaling dicts), factor s, training length L
SCALINGS = ("none", "pi", "ntk", "dynamic", "yarn", "llama3")
# fine-tuned at 2× with their factor-2 scaling; "none" (no scaling, the same extra training) is the control
FINETUNES = ("none", "pi", "yarn")


def scaling_for(method: str, factor: int, seq_len: int) -> dict | None:
    """The rope_scaling dict for ``method`` at ``factor`` × a training length of ``seq_len`` tokens.

    Dynamic NTK takes factor 1: its base then grows with the length seen, by exactly (length / L) beyond L.
    Llama 3 uses Llama 3.1's bands (low_freq_factor 1, high_freq_factor 4).
    """
    if method == "none":
        return None
    table = {
        "pi": {"rope_type": "linear", "factor": float(factor)},
        "ntk": {"rope_type": "ntk", "factor": float(factor)},
        "dynamic": {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": seq_len},
        "yarn": {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": seq_len},
        "llama3": {"rope_type": "llama3", "factor": float(factor), "original_max_position_embeddings": seq_len,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    }
    if method not in table:
        raise ValueError(f"method: expected one of {SCALINGS}, got {method!r}")
    return table[method]
