"""HybridConfig: one dataclass for every model of the library, with named presets.

A model is ``n_layers`` pre-norm blocks whose mixers follow ``pattern`` repeated to length ``n_layers``; the
letters are the rows of the mixer table (``models/mixers.py``):

    R   VO-RoPE recurrence (complex scan)           hybrid.recurrence.VORecurrence      config.recurrence
    A   softmax attention, rotary on q/k/v/o         hybrid.attention.Attention          config.attention
    M   RetNet multi-scale retention                 hybrid.retention.MultiScaleRetention config.retention

The config is the stack's fields, the rotary options every mixer shares (``config.rotary``, a
``hybrid.rotary.RotaryConfig``) and one section per table row, each that mixer's own options dataclass
(``config.attention.window``). Fields are set by stack name, by dotted name (``"attention.window"``), by section
(``attention=AttentionConfig(...)``, which sets every field of it, or a dict, which sets its keys) or by the
old flat names (``window``, ``rope_base``, ``rnn_phase``, …, ``models.config_names.FLAT_ALIASES``), which also
stay readable as compatibility aliases (``config.window``, ``config.resolved_rnn_phase``).

Presets (``HybridConfig.preset(name, size)``):

    transformer   all A, QK-RoPE, global attention
    retnet        all M
    vo-rnn        all R
    vo-gla        all G (VO-RoPE gated linear attention: selective decay, static VO-RoPE phase)
    hybrid        "RRA": two R layers per A layer, attention QKVO-RoPE with a sliding window
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch

from hybrid.abs_pos import ABS_POS_KINDS
from hybrid.checks import check_bool, check_heads, check_number, check_positive_int
from hybrid.rotary import RotaryConfig

from . import mixers as mixer_table
from .config_names import FLAT_ALIASES, options_fields, parse, respell, spellings

RECOMPUTE = ("none", "linear", "all")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}

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
    "vo-gla": dict(pattern="G"),
    "hybrid": dict(pattern="RRA", rope_placement="qkvo", window="size"),
}


def _upgrade(d: dict) -> dict:
    """Older configs (checkpoints) in today's fields: ``rnn_learnable_theta`` became ``rnn_phase="learned"``."""
    if "rnn_learnable_theta" not in d:
        return d
    d = dict(d)
    if check_bool("rnn_learnable_theta", d.pop("rnn_learnable_theta")):
        if d.get("rnn_phase") not in (None, "learned"):
            raise ValueError(f"rnn_learnable_theta: contradicts rnn_phase={d['rnn_phase']!r}; set one")
        if d.get("carope") and "R" in d.get("pattern", "R"):
            raise ValueError("rnn_learnable_theta: has no effect with carope=True (CARoPE supplies the angles)")
        d["rnn_phase"] = "learned"
    return d


def _sections() -> dict[str, type]:
    """Section name → its options dataclass: the rotary options, then one per row of the mixer table."""
    out = {"rotary": RotaryConfig}
    for letter, row in mixer_table.MIXERS.items():
        if row.name in out or row.name in _STACK or row.name in FLAT_ALIASES:
            raise ValueError(f"MIXERS: row {letter!r} needs a section name of its own, got {row.name!r}")
        out[row.name] = row.cls.Config
    return out


@dataclass(frozen=True, init=False)
class HybridConfig:
    """The stack's fields, ``rotary`` and one options section per mixer (``mixers``: section name → options,
    read as ``config.<name>``). Every value is validated on construction; errors name the field as it was
    given (stack name, dotted name or old flat name). Immutable: ``replace`` makes a changed copy."""

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
    # absolute positions added to the token embedding: None, "learned" (a table of abs_pos_max_len vectors;
    # longer inputs are an error) or "sinusoidal" (fixed, any length)
    abs_pos: str | None = None
    abs_pos_max_len: int | None = None
    # training memory: which blocks keep only their input and recompute their activations in backward
    # (activation checkpointing): "none"; "linear" = every block whose mixer is cheap to recompute (its
    # options' `cheap_to_recompute`: R, M, windowed A), leaving the global attention blocks alone; "all".
    # Same numbers either way.
    recompute: str = "none"
    # free-form provenance (preset name, size); not used by the model
    meta: dict = field(default_factory=dict)
    # the rotary options every mixer shares, and each mixer's own
    rotary: RotaryConfig = field(default_factory=RotaryConfig)
    mixers: dict = field(default_factory=dict)

    def __init__(self, **values):
        self._set(values)

    # ------------------------------------------------------------------------------------------ building

    def _set(self, values: dict, base: "HybridConfig | None" = None, quiet: dict | None = None) -> None:
        """Fill the fields from `values` (any spelling) over `base`'s values (or the defaults) and `quiet`
        values (a preset's, named in errors by default spellings), then validate."""
        sections = _sections()
        given, spelled, unknown = parse(values, _STACK, sections)
        if unknown:
            raise ValueError(f"config: unknown field(s) {sorted(unknown)}; known fields are "
                             f"{sorted(HybridConfig.field_names())}")
        values = base._values() if base is not None else {}
        if quiet:
            values.update(parse(quiet, _STACK, sections)[0])
        values.update(given)
        for f in dataclasses.fields(HybridConfig):
            if f.name in _STACK:
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                object.__setattr__(self, f.name, values.get(f.name, default))
        head_dim = self._check_stack()
        dotted = any("." in name for name in spelled.values())

        def names(section: str) -> dict[str, str]:  # a section's fields as the user spells them
            return spellings(section, options_fields(sections[section]), spelled, dotted)

        built = {}
        for section, cls in sections.items():
            fields_given = {f: values[(section, f)] for f in options_fields(cls) if (section, f) in values}
            try:
                built[section] = cls(**fields_given)
            except ValueError as e:
                raise respell(e, names(section)) from None
        rotary = built.pop("rotary")
        object.__setattr__(self, "rotary", rotary)
        object.__setattr__(self, "mixers", built)
        for letter in dict.fromkeys(self.pattern):  # each letter of the pattern once, in order
            section = mixer_table.MIXERS[letter].name
            try:
                built[section].check_with(n_heads=self.n_heads, head_dim=head_dim, rotary=rotary)
            except ValueError as e:
                raise respell(e, {**names("rotary"), **names(section)}) from None

    def _check_stack(self) -> int:
        """Validate the stack's fields; returns the head size."""
        for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
            check_positive_int(name, getattr(self, name))
        for name in ("mlp_ratio", "norm_eps", "init_std"):
            check_number(name, getattr(self, name), low=0, low_open=True)
        letters = mixer_table.MIXERS
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError(f"pattern: expected a non-empty string of mixer letters {sorted(letters)}, "
                             f"got {self.pattern!r}")
        bad = sorted(set(self.pattern) - set(letters))
        if bad:
            raise ValueError(
                f"pattern: unknown mixer letter(s) {bad} in {self.pattern!r}; expected letters from "
                + ", ".join(f"{k} ({row.name})" for k, row in letters.items())
            )
        head_dim = check_heads(self.d_model, self.n_heads, self.head_dim)
        check_positive_int("mlp_hidden", self.mlp_hidden, allow_none=True)
        if self.abs_pos is not None and self.abs_pos not in ABS_POS_KINDS:
            raise ValueError(f"abs_pos: expected None or one of {ABS_POS_KINDS}, got {self.abs_pos!r}")
        if self.abs_pos == "learned":
            if self.abs_pos_max_len is None:
                raise ValueError("abs_pos_max_len: abs_pos='learned' needs the table length, expected a positive "
                                 "int, got None")
            check_positive_int("abs_pos_max_len", self.abs_pos_max_len)
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
        check_bool("tie_embeddings", self.tie_embeddings)
        return head_dim

    def _values(self) -> dict:
        """Every value, keyed by stack name or (section, field)."""
        out = {name: getattr(self, name) for name in _STACK}
        for section, options in {"rotary": self.rotary, **self.mixers}.items():
            out.update({(section, f): getattr(options, f) for f in options_fields(type(options))})
        return out

    # ------------------------------------------------------------------------------------------ sections

    def section(self, name: str):
        """The options of one section: "rotary" or a mixer table name ("attention", "recurrence", …)."""
        if name == "rotary":
            return self.rotary
        if name not in self.mixers:
            raise ValueError(f"section: expected one of {['rotary', *self.mixers]}, got {name!r}")
        return self.mixers[name]

    def mixer_config(self, letter: str):
        """The options of the mixer a pattern letter names."""
        return self.section(mixer_table.mixer_row(letter).name)

    def __getattr__(self, name: str):
        """`config.<section>` and the old flat names (`config.window` = `config.attention.window`)."""
        mixers = self.__dict__.get("mixers")
        if mixers is not None:
            if name in mixers:
                return mixers[name]
            if name in FLAT_ALIASES:
                section, f = FLAT_ALIASES[name]
                return getattr(self.section(section), f)
        raise AttributeError(f"'HybridConfig' object has no attribute {name!r}")

    def __repr__(self) -> str:
        parts = [f"{name}={getattr(self, name)!r}" for name in _STACK]
        parts += [f"{name}={options!r}" for name, options in {"rotary": self.rotary, **self.mixers}.items()]
        return f"HybridConfig({', '.join(parts)})"

    @classmethod
    def section_names(cls) -> tuple[str, ...]:
        """The sections, each settable whole (a dict or options object): "rotary", then the mixer table's names."""
        return tuple(_sections())

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Every settable name: the stack's fields, each section's dotted fields, the old flat names."""
        dotted = [f"{s}.{f}" for s, options in _sections().items() for f in options_fields(options)]
        return (*_STACK, *dotted, *FLAT_ALIASES)

    # ------------------------------------------------------------------------------------------ derived

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def resolved_rnn_phase(self) -> str:
        """The R layers' angle kind: ``recurrence.phase``, or by default "carope" when ``rotary.carope``, else
        "static" (a compatibility alias of ``recurrence.resolved_phase(rotary)``)."""
        return self.section("recurrence").resolved_phase(self.rotary)

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
        """True when the decode state does not grow with the sequence (no mixer of the pattern declares
        ``state_grows``: no global attention layer)."""
        return not any(self.mixer_config(letter).state_grows for letter in set(self.pattern))

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model can take (learned absolute positions), None when unlimited."""
        return self.abs_pos_max_len if self.abs_pos == "learned" else None

    # ------------------------------------------------------------------------------------------ I/O

    def to_dict(self) -> dict:
        """The stack's fields, then one nested dict per section (`{"rotary": {...}, "attention": {...}, …}`)."""
        out = {name: copy.deepcopy(getattr(self, name)) for name in _STACK}
        for name, options in {"rotary": self.rotary, **self.mixers}.items():
            out[name] = dataclasses.asdict(options)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "HybridConfig":
        """A config from `to_dict`'s nested dict, or from an old flat one (checkpoints before the sections)."""
        if not isinstance(d, dict):
            raise ValueError(f"config: expected a dict, got {type(d).__name__}")
        return cls(**_upgrade(d))

    def replace(self, **overrides) -> "HybridConfig":
        """A copy with some fields changed, in any spelling: ``replace(window=8)``,
        ``replace(**{"attention.window": 8})``, ``replace(attention=AttentionConfig(window=8))``."""
        new = object.__new__(HybridConfig)
        new._set(overrides, base=self)
        return new

    @classmethod
    def preset(cls, name: str, size: str = "tiny", **overrides) -> "HybridConfig":
        """A named preset at a named size, with any field overridden (in any spelling).

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
        new = object.__new__(cls)
        new._set(overrides, quiet=values)
        return new


_STACK = tuple(f.name for f in dataclasses.fields(HybridConfig) if f.name not in ("rotary", "mixers"))
