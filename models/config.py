"""HybridConfig: one dataclass for every model of the library, with named presets.

A model is ``n_layers`` pre-norm blocks whose mixers follow ``pattern`` repeated to length ``n_layers``:

    R   VO-RoPE recurrence (complex scan)           hybrid.recurrence.VORecurrence
    A   softmax attention, rotary on q/k/v/o         hybrid.attention.Attention
    M   RetNet multi-scale retention                 hybrid.retention.MultiScaleRetention

Presets (``HybridConfig.preset(name, size)``):

    transformer   all A, QK-RoPE, global attention
    retnet        all M
    vo-rnn        all R
    hybrid        "RRA": two R layers per A layer, attention QKVO-RoPE with a sliding window
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

import torch

from hybrid.abs_pos import ABS_POS_KINDS
from hybrid.checks import check_even_dim, check_number, check_positive_int
from hybrid.recurrence import PHASES as RNN_PHASES
from hybrid.recurrence import SELECTIVE_GATES
from hybrid.rotary import PHASE_MAPS, PLACEMENTS, inv_freq, parse_placement

MIXER_LETTERS = {"R": "VO-RoPE recurrence", "A": "attention", "M": "multi-scale retention"}
RECOMPUTE = ("none", "linear", "all")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# shared-KV caches one tensor as key and value, so k and v must be rotated alike
SHARED_KV_PLACEMENTS = tuple(p for p in PLACEMENTS if parse_placement(p).k == parse_placement(p).v)

# size -> (d_model, n_layers, n_heads); parameter counts are for the byte vocabulary (embedding ≈ 0)
SIZES = {
    "tiny": dict(d_model=128, n_layers=4, n_heads=4),  # ≈ 0.8M: trains on a 2-core CPU in minutes
    "small": dict(d_model=512, n_layers=8, n_heads=8),  # ≈ 25M
    "base": dict(d_model=768, n_layers=18, n_heads=12),  # ≈ 125M
    "large": dict(d_model=1024, n_layers=28, n_heads=16),  # ≈ 350M
}
WINDOWS = {"tiny": 64, "small": 512, "base": 1024, "large": 2048}
PRESETS = {
    "transformer": dict(pattern="A", rope_placement="qk", window=None),
    "retnet": dict(pattern="M"),
    "vo-rnn": dict(pattern="R"),
    "hybrid": dict(pattern="RRA", rope_placement="qkvo", window="size"),
}


def _upgrade(d: dict) -> dict:
    """Older configs (checkpoints) in today's fields: ``rnn_learnable_theta`` became ``rnn_phase="learned"``."""
    if "rnn_learnable_theta" not in d:
        return d
    d = dict(d)
    learnable = d.pop("rnn_learnable_theta")
    if not isinstance(learnable, bool):
        raise ValueError(f"rnn_learnable_theta: expected True or False, got {learnable!r}")
    if learnable:
        if d.get("rnn_phase") not in (None, "learned"):
            raise ValueError(f"rnn_learnable_theta: contradicts rnn_phase={d['rnn_phase']!r}; set one")
        if d.get("carope") and "R" in d.get("pattern", "R"):
            raise ValueError("rnn_learnable_theta: has no effect with carope=True (CARoPE supplies the angles)")
        d["rnn_phase"] = "learned"
    return d


@dataclass
class HybridConfig:
    """Every field is validated in ``__post_init__``; errors name the field."""

    # the stack
    vocab_size: int = 264
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    pattern: str = "RRA"
    head_dim: int | None = None  # default d_model // n_heads
    mlp_ratio: float = 8 / 3  # SwiGLU hidden ≈ mlp_ratio · d_model (rounded up to a multiple of 32)
    mlp_hidden: int | None = None  # explicit SwiGLU hidden width (imported checkpoints); overrides mlp_ratio
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    init_std: float = 0.02
    dtype: str = "float32"  # parameter dtype
    # attention (A)
    n_kv_heads: int | None = None  # GQA / MQA; default n_heads
    window: int | None = None  # sliding window; None = global
    shared_kv: bool = False  # one projection serves as key and value (cache holds one tensor)
    attention_bias: bool = False  # biases on the q/k/v and output projections (imported Qwen2 / Llama checkpoints)
    # rotary (A, R, M)
    rope_base: float = 10000.0
    rope_scaling: dict | None = None  # Llama/HF-style: {"rope_type": "yarn", "factor": 4, ...}
    rope_placement: str = "qkvo"  # any of hybrid.rotary.PLACEMENTS, for attention
    rope_layout: str = "interleaved"  # or "half"
    rotary_dim: int | None = None  # partial rotary (attention); default head_dim
    carope: bool = False  # context-aware phases (attention and recurrence)
    # absolute positions added to the token embedding: None, "learned" (a table of abs_pos_max_len vectors;
    # longer inputs are an error) or "sinusoidal" (fixed, any length)
    abs_pos: str | None = None
    abs_pos_max_len: int | None = None
    # recurrence (R)
    rnn_r_min: float = 0.9
    rnn_r_max: float = 0.999
    rnn_selective: bool = False  # data-dependent decay (RG-LRU-like gate)
    rnn_selective_gate: str = "sigmoid"  # its recurrence gate: "sigmoid" (RG-LRU) or "hardsigmoid" (can hold γ_t = 1)
    # rotation angles: "static" (rotary schedule), "learned" (the schedule as a parameter), "carope" (CARoPE
    # increments), "data" (θ_t = π·σ(W x_t + b) per pair); None = "carope" when carope=True, else "static"
    rnn_phase: str | None = None
    # the "data" angle map: "pi-sigmoid" (0, π), "2pi-tanh" (−2π, 2π) or "pi-hardsigmoid" [0, π] (exact 0 and π)
    rnn_phase_map: str = "pi-sigmoid"
    rnn_conv_width: int = 4
    # retention (M)
    retention_chunk: int = 64  # tile of its chunkwise form: O(T·retention_chunk); same numbers for any value
    # training memory: which blocks keep only their input and recompute their activations in backward
    # (activation checkpointing): "none"; "linear" = every block whose mixer costs O(T) (R, M, windowed A), so
    # the recomputation is cheap and the global attention blocks are left alone; "all". Same numbers either way.
    recompute: str = "none"
    # free-form provenance (preset name, size); not used by the model
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        def positive_int(name):
            check_positive_int(name, getattr(self, name))

        def positive_float(name):
            check_number(name, getattr(self, name), low=0, low_open=True)

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "rnn_conv_width", "retention_chunk"):
            positive_int(name)
        for name in ("mlp_ratio", "norm_eps", "init_std"):
            positive_float(name)
        # base <= 1 would make the rotary frequencies base^(-2i/d) >= 1: no slow pairs, no long-range positions
        check_number("rope_base", self.rope_base, low=1, low_open=True)
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError(f"pattern: expected a non-empty string of mixer letters {sorted(MIXER_LETTERS)}, got {self.pattern!r}")
        bad = sorted(set(self.pattern) - set(MIXER_LETTERS))
        if bad:
            raise ValueError(
                f"pattern: unknown mixer letter(s) {bad} in {self.pattern!r}; expected letters from "
                + ", ".join(f"{k} ({v})" for k, v in MIXER_LETTERS.items())
            )
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"n_heads: expected a divisor of d_model={self.d_model} (or set head_dim), got {self.n_heads}"
                )
        else:
            positive_int("head_dim")
        check_even_dim("head_dim", self.resolved_head_dim)  # d_model // n_heads when head_dim is None
        if self.n_kv_heads is not None:
            positive_int("n_kv_heads")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads: expected a divisor of n_heads={self.n_heads}, got {self.n_kv_heads}")
        if self.window is not None:
            positive_int("window")
        if self.mlp_hidden is not None:
            positive_int("mlp_hidden")
        if self.rotary_dim is not None:
            check_even_dim("rotary_dim", self.rotary_dim, at_most=self.resolved_head_dim)
        if self.rope_placement not in PLACEMENTS:
            raise ValueError(f"rope_placement: expected one of {list(PLACEMENTS)}, got {self.rope_placement!r}")
        if self.rope_layout not in ("interleaved", "half"):
            raise ValueError(f"rope_layout: expected 'interleaved' or 'half', got {self.rope_layout!r}")
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, dict):
                raise ValueError(f"rope_scaling: expected a dict or None, got {type(self.rope_scaling).__name__}")
            try:
                inv_freq(self.resolved_head_dim, base=self.rope_base, scaling=self.rope_scaling)
            except ValueError as e:
                raise ValueError(f"rope_scaling: {e}") from None
        if self.shared_kv and self.rope_placement not in SHARED_KV_PLACEMENTS:
            raise ValueError(
                f"shared_kv: one cached tensor cannot serve as key and value under rope_placement="
                f"{self.rope_placement!r} (k and v would need different rotations); use one of {SHARED_KV_PLACEMENTS}"
            )
        if not (0.0 < self.rnn_r_min <= self.rnn_r_max < 1.0):
            raise ValueError(
                f"rnn_r_min, rnn_r_max: expected 0 < rnn_r_min <= rnn_r_max < 1, got {self.rnn_r_min}, {self.rnn_r_max}"
            )
        if self.carope and self.rope_scaling is not None:
            raise ValueError("carope: CARoPE has no context-extension scaling; set rope_scaling=None or carope=False")
        if self.carope and self.rope_placement == "none" and "A" in self.pattern:
            raise ValueError("carope: rope_placement='none' rotates nothing, so CARoPE's phases would be unused")
        if self.rnn_phase is not None and self.rnn_phase not in RNN_PHASES:
            raise ValueError(f"rnn_phase: expected one of {RNN_PHASES} or None, got {self.rnn_phase!r}")
        if self.rnn_phase_map not in PHASE_MAPS:
            raise ValueError(f"rnn_phase_map: expected one of {PHASE_MAPS}, got {self.rnn_phase_map!r}")
        if self.rnn_selective_gate not in SELECTIVE_GATES:
            raise ValueError(f"rnn_selective_gate: expected one of {tuple(SELECTIVE_GATES)}, got {self.rnn_selective_gate!r}")
        if self.rnn_selective_gate != "sigmoid" and self.rnn_selective is not True:
            raise ValueError(f"rnn_selective_gate: has no effect without rnn_selective=True, got {self.rnn_selective_gate!r}")
        if self.rnn_phase == "carope" and self.rope_scaling is not None and "R" in self.pattern:
            raise ValueError("rnn_phase: CARoPE has no context-extension scaling; set rope_scaling=None or another rnn_phase")
        if self.abs_pos is not None and self.abs_pos not in ABS_POS_KINDS:
            raise ValueError(f"abs_pos: expected None or one of {ABS_POS_KINDS}, got {self.abs_pos!r}")
        if self.abs_pos == "learned":
            if self.abs_pos_max_len is None:
                raise ValueError("abs_pos_max_len: abs_pos='learned' needs the table length, expected a positive int, got None")
            positive_int("abs_pos_max_len")
        elif self.abs_pos_max_len is not None:
            raise ValueError(
                f"abs_pos_max_len: only abs_pos='learned' has a table length, expected None with abs_pos="
                f"{self.abs_pos!r}, got {self.abs_pos_max_len!r}"
            )
        if self.abs_pos == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"d_model: sinusoidal positions need an even d_model, got {self.d_model}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute: expected one of {RECOMPUTE}, got {self.recompute!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {self.dtype!r}")
        for name in ("tie_embeddings", "shared_kv", "attention_bias", "carope", "rnn_selective"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected True or False, got {getattr(self, name)!r}")

    # ------------------------------------------------------------------------------------------ derived

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def resolved_rnn_phase(self) -> str:
        """The R layers' angle kind: ``rnn_phase``, or by default "carope" when carope=True, else "static"."""
        if self.rnn_phase is not None:
            return self.rnn_phase
        return "carope" if self.carope else "static"

    @property
    def layer_types(self) -> str:
        """The pattern repeated to ``n_layers`` letters: "RRA", 7 layers -> "RRARRAR"."""
        reps = -(-self.n_layers // len(self.pattern))
        return (self.pattern * reps)[: self.n_layers]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def state_is_fixed(self) -> bool:
        """True when the decode state does not grow with the sequence (no global attention layer)."""
        return "A" not in self.layer_types or self.window is not None

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model can take (learned absolute positions), None when unlimited."""
        return self.abs_pos_max_len if self.abs_pos == "learned" else None

    # ------------------------------------------------------------------------------------------ I/O

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HybridConfig":
        if not isinstance(d, dict):
            raise ValueError(f"config: expected a dict, got {type(d).__name__}")
        d = _upgrade(d)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"config: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**d)

    def replace(self, **overrides) -> "HybridConfig":
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"config: unknown field(s) {unknown}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def preset(cls, name: str, size: str = "tiny", **overrides) -> "HybridConfig":
        """A named preset at a named size, with any field overridden.

        >>> HybridConfig.preset("hybrid", "small", window=256).layer_types
        'RRARRARR'
        """
        if name not in PRESETS:
            raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
        if size not in SIZES:
            raise ValueError(f"size: expected one of {list(SIZES)}, got {size!r}")
        values = dict(SIZES[size])
        for key, value in PRESETS[name].items():
            values[key] = WINDOWS[size] if value == "size" else value
        values["meta"] = {"preset": name, "size": size}
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"config: unknown field(s) {unknown}")
        values.update(overrides)
        return cls(**values)
