"""Rotary frequency schedules: `inv_freq(dim, base, scaling, seq_len) -> (θ float32 (dim/2,), attention_factor)`.

Plain RoPE: `θ_i = base^(−2i/dim)`, i = 0 … dim/2 − 1. `scaling` is None or a Hugging Face-style
`rope_scaling` dict (`"rope_type"`, or its old alias `"type"`, plus that type's keys) that rescales the θ_i
for context extension. Notation: s = `factor`, L0 = `original_max_position_embeddings`, d = dim.

| rope_type  | θ'_i                                                                   | attention_factor      |
| ---------- | ---------------------------------------------------------------------- | --------------------- |
| `linear`   | θ_i / s  (position interpolation)                                      | 1                     |
| `ntk`      | (b·s^(d/(d−2)))^(−2i/d)  (NTK-aware base)                              | 1                     |
| `dynamic`  | (b·(s·L/L0 − (s−1))^(d/(d−2)))^(−2i/d), L = max(seq_len, L0)           | 1                     |
| `yarn`     | θ_i·(1 − ρ_i) + (θ_i/s)·ρ_i, ρ = wavelength ramp (`_yarn_ramp`)         | 0.1·ln s + 1          |
| `longrope` | θ_i / λ_i, λ = long_factor if seq_len > L0 else short_factor           | √(1 + ln s / ln L0)   |
| `llama3`   | θ_i, θ_i/s, or the smooth blend between, by wavelength band            | 1                     |

Every formula matches `transformers.modeling_rope_utils` to float32 rounding; here it is evaluated in
float64 and rounded once. `attention_factor` is what HF multiplies cos and sin by; in this library rotations
stay orthogonal and the factor is returned for attention to apply (logits × attention_factor², see
docs/rotary.md).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from hybrid.checks import check_bool, check_even_dim, check_int, check_number, check_positive_int, check_rotary_base
from hybrid.computed_buffers import on_host

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3")

_L0 = "original_max_position_embeddings"
_REQUIRED = {
    "default": set(),
    "linear": {"factor"},
    "ntk": {"factor"},
    "dynamic": {"factor", _L0},
    "yarn": {"factor", _L0},
    "longrope": {"short_factor", "long_factor", _L0},
    "llama3": {"factor", _L0, "low_freq_factor", "high_freq_factor"},
}
_OPTIONAL = {
    "default": {_L0},
    "linear": {_L0},
    "ntk": {_L0},
    "dynamic": set(),
    "yarn": {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
    "longrope": {"factor", "attention_factor"},
    "llama3": set(),
}
_HINTS = {
    "rope_theta": " (pass it as base=)",
    "partial_rotary_factor": " (pass rotary_dim= to Rotary instead)",
}


# ----------------------------------------------------------------------------------------------- validation
def _real(cfg: dict, key: str, *, low: float | None = None, strict: bool = False) -> float:
    return check_number(f"scaling[{key!r}]", cfg[key], low=low, low_open=strict)


def _positive_int(cfg: dict, key: str) -> int:
    check_positive_int(f"scaling[{key!r}]", cfg[key])
    return int(cfg[key])


def _per_pair(cfg: dict, key: str, n: int) -> torch.Tensor:
    v = cfg[key]
    try:
        t = torch.as_tensor(v, dtype=torch.float64).flatten() if not isinstance(v, (str, bytes)) else None
    except (TypeError, ValueError, RuntimeError):
        t = None
    if t is None or t.numel() != n:
        got = f"length {t.numel()}" if t is not None else repr(v)
    else:
        bad = (~torch.isfinite(t) | (t <= 0)).nonzero().flatten()
        got = f"{t[bad[0]].item()!r} at index {bad[0].item()}" if bad.numel() else None
    if got is not None:
        raise ValueError(f"scaling[{key!r}] must hold dim/2 = {n} positive finite numbers, got {got}")
    return t


def _normalise(scaling, dim: int) -> tuple[str, dict]:
    """Check a scaling dict; return (rope_type, dict without the type key)."""
    if not isinstance(scaling, Mapping):
        raise ValueError(f"scaling: expected None or a dict like {{'rope_type': 'yarn', ...}}, got {scaling!r}")
    cfg = {k: v for k, v in scaling.items() if v is not None}  # HF configs serialise unset keys as null
    if "rope_type" in cfg and "type" in cfg and cfg["rope_type"] != cfg["type"]:
        raise ValueError(f"scaling['rope_type'] and its alias scaling['type'] disagree: {cfg['rope_type']!r} "
                         f"vs {cfg['type']!r}")
    rope_type = cfg.pop("rope_type", None)
    alias = cfg.pop("type", None)
    rope_type = rope_type if rope_type is not None else alias
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"scaling['rope_type']: expected one of {ROPE_TYPES}, got {rope_type!r}")
    unknown = set(cfg) - _REQUIRED[rope_type] - _OPTIONAL[rope_type]
    if unknown:
        key = sorted(unknown, key=str)[0]
        allowed = sorted(_REQUIRED[rope_type] | _OPTIONAL[rope_type])
        raise ValueError(f"scaling[{key!r}] is not a key of rope_type {rope_type!r}{_HINTS.get(key, '')}; "
                         f"allowed keys: {allowed}")
    missing = _REQUIRED[rope_type] - set(cfg)
    if missing:
        key = sorted(missing)[0]
        raise ValueError(f"scaling[{key!r}] is required for rope_type {rope_type!r} (missing: {sorted(missing)})")
    if rope_type in ("ntk", "dynamic") and dim <= 2:
        raise ValueError(f"dim: expected > 2 for rope_type {rope_type!r} (exponent d/(d−2)), got {dim}")
    return rope_type, cfg


# ------------------------------------------------------------------------------------------------ schedules
def _default(dim: int, base: float) -> torch.Tensor:
    """θ_i = base^(−2i/dim), float64 `(dim/2,)`."""
    i = torch.arange(dim // 2, dtype=torch.float64)
    return torch.pow(torch.tensor(float(base), dtype=torch.float64), -2.0 * i / dim)


def _linear(dim, base, cfg, seq_len):
    """Position interpolation: θ'_i = θ_i / s."""
    s = _real(cfg, "factor", low=1.0)
    return _default(dim, base) / s, 1.0


def _ntk(dim, base, cfg, seq_len):
    """NTK-aware: base' = base · s^(d/(d−2)), θ'_i = base'^(−2i/d)."""
    s = _real(cfg, "factor", low=1.0)
    return _default(dim, base * s ** (dim / (dim - 2))), 1.0


def _dynamic_base(dim, base, cfg, L):
    """Dynamic NTK's base' = base · (s·L/L0 − (s − 1))^(d/(d−2)) at the total length L ≥ L0 (a float, or a float64
    tensor of totals); at L = L0 it is base itself."""
    s, L0 = _real(cfg, "factor", low=1.0), _positive_int(cfg, _L0)
    return base * (s * L / L0 - (s - 1.0)) ** (dim / (dim - 2))


def _dynamic(dim, base, cfg, seq_len):
    """Dynamic NTK: L = max(seq_len, L0), θ'_i = base'^(−2i/d) (``_dynamic_base``); plain RoPE for L ≤ L0."""
    L0 = _positive_int(cfg, _L0)
    return _default(dim, _dynamic_base(dim, base, cfg, seq_len if seq_len is not None and seq_len > L0 else L0)), 1.0


def dynamic_frequencies(dim: int, base: float, scaling, totals: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK's θ ``(N, dim/2)`` float32, row n at the total length ``totals[n]`` (``(N,)`` integers), computed
    on the totals' device from their values: nothing is read back, so a decode step or a CUDA graph can hold it.
    Row n is ``_dynamic``'s θ at ``seq_len = totals[n]`` (the same float64 formula, rounded once; plain RoPE's
    base for totals ≤ L0)."""
    _, cfg = _normalise(scaling, dim)
    grown = _dynamic_base(dim, base, cfg, totals.to(torch.float64).clamp(min=_positive_int(cfg, _L0)))  # (N,) base'
    i = torch.arange(dim // 2, dtype=torch.float64, device=totals.device)
    return torch.pow(grown[:, None], -2.0 * i / dim).to(torch.float32)  # (N, dim/2)


def _yarn_mscale(s: float, m: float = 1.0) -> float:
    """YaRN's attention temperature: 1 for s ≤ 1, else 0.1·m·ln s + 1."""
    return 1.0 if s <= 1.0 else 0.1 * m * math.log(s) + 1.0


def _yarn_ramp(dim: int, base: float, L0: int, beta_fast: float, beta_slow: float, truncate: bool) -> torch.Tensor:
    """ρ_i ∈ [0, 1], the share of interpolation for pair i (0 = keep θ_i, 1 = θ_i/s).

    The pair index that completes r turns over L0 tokens is `c(r) = d·ln(L0 / (2π r)) / (2 ln b)`.
    low = max(⌊c(β_fast)⌋, 0), high = min(⌈c(β_slow)⌉, d − 1) (no ⌊⌋/⌈⌉ when truncate=False);
    if low == high, high += 0.001; ρ_i = clamp((i − low) / (high − low), 0, 1), i = 0 … d/2 − 1.
    """
    def turns_to_index(r: float) -> float:
        return dim * math.log(L0 / (r * 2.0 * math.pi)) / (2.0 * math.log(base))

    low, high = turns_to_index(beta_fast), turns_to_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    i = torch.arange(dim // 2, dtype=torch.float64)
    return ((i - low) / (high - low)).clamp(0.0, 1.0)


def _yarn(dim, base, cfg, seq_len):
    """YaRN: θ'_i = θ_i·(1 − ρ_i) + (θ_i/s)·ρ_i with ρ from `_yarn_ramp` (β_fast = 32, β_slow = 1 by default).

    attention_factor: as given; else mscale(s, mscale)/mscale(s, mscale_all_dim) when both are set and
    non-zero (DeepSeek-V3 style); else mscale(s) = 0.1·ln s + 1.
    """
    s = _real(cfg, "factor", low=1.0)
    L0 = _positive_int(cfg, _L0)
    beta_fast = _real(cfg, "beta_fast", low=0.0, strict=True) if "beta_fast" in cfg else 32.0
    beta_slow = _real(cfg, "beta_slow", low=0.0, strict=True) if "beta_slow" in cfg else 1.0
    if beta_fast < beta_slow:
        raise ValueError(f"scaling['beta_fast']: expected a number >= beta_slow={beta_slow:g}, got {beta_fast:g}")
    truncate = check_bool("scaling['truncate']", cfg.get("truncate", True))
    if "attention_factor" in cfg:
        attn = _real(cfg, "attention_factor", low=0.0, strict=True)
    else:
        m = _real(cfg, "mscale") if "mscale" in cfg else 0.0
        m_all = _real(cfg, "mscale_all_dim") if "mscale_all_dim" in cfg else 0.0
        attn = _yarn_mscale(s, m) / _yarn_mscale(s, m_all) if (m and m_all) else _yarn_mscale(s)
    theta = _default(dim, base)
    rho = _yarn_ramp(dim, base, L0, beta_fast, beta_slow, truncate)
    return theta * (1.0 - rho) + (theta / s) * rho, float(attn)


def _longrope(dim, base, cfg, seq_len):
    """LongRoPE: θ'_i = θ_i / λ_i, λ = long_factor when seq_len > L0, else short_factor (also for seq_len=None).

    attention_factor: as given; else √(1 + ln s / ln L0) with s = `factor` (1 when s ≤ 1). HF derives s from
    the model's max_position_embeddings / L0 when `factor` is absent; without a model config here, `factor`
    is required unless `attention_factor` is given.
    """
    L0 = _positive_int(cfg, _L0)
    short = _per_pair(cfg, "short_factor", dim // 2)
    long = _per_pair(cfg, "long_factor", dim // 2)
    if "attention_factor" in cfg:
        attn = _real(cfg, "attention_factor", low=0.0, strict=True)
        if "factor" in cfg:
            _real(cfg, "factor", low=1.0)
    else:
        if "factor" not in cfg:
            raise ValueError("scaling['factor'] is required for rope_type 'longrope' unless "
                             "scaling['attention_factor'] is given (s = max_position / original_max_position)")
        s = _real(cfg, "factor", low=1.0)
        attn = 1.0 if s <= 1.0 or L0 == 1 else math.sqrt(1.0 + math.log(s) / math.log(L0))
    lam = long if seq_len is not None and seq_len > L0 else short
    return _default(dim, base) / lam, float(attn)


def _llama3(dim, base, cfg, seq_len):
    """Llama 3.1: with wavelength w_i = 2π/θ_i, w_lo = L0/low_freq_factor, w_hi = L0/high_freq_factor:
    θ'_i = θ_i if w_i < w_hi;  θ_i/s if w_i > w_lo;  else (1 − σ)·θ_i/s + σ·θ_i with
    σ = (L0/w_i − low_freq_factor) / (high_freq_factor − low_freq_factor).
    """
    s = _real(cfg, "factor", low=1.0)
    L0 = _positive_int(cfg, _L0)
    lo = _real(cfg, "low_freq_factor", low=0.0, strict=True)
    hi = _real(cfg, "high_freq_factor", low=0.0, strict=True)
    if hi <= lo:
        raise ValueError(f"scaling['high_freq_factor']: expected a number > low_freq_factor={lo:g}, got {hi:g}")
    theta = _default(dim, base)
    wavelen = 2.0 * math.pi / theta
    sigma = (L0 / wavelen - lo) / (hi - lo)
    smooth = (1.0 - sigma) * theta / s + sigma * theta
    out = torch.where(wavelen > L0 / lo, theta / s, theta)
    medium = (wavelen >= L0 / hi) & (wavelen <= L0 / lo)
    return torch.where(medium, smooth, out), 1.0


_SCHEDULES = {
    "default": lambda dim, base, cfg, seq_len: (_default(dim, base), 1.0),
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
}


def check_dim_base(dim, base) -> None:
    """ValueError unless dim is a positive even int and base a finite number > 1."""
    check_even_dim("dim", dim)
    check_rotary_base("base", base)


def length_dependence(scaling, dim: int) -> tuple[str, int | None]:
    """(rope_type, L0) where the frequencies change with seq_len above L0 (`dynamic`, `longrope`), else
    (rope_type, None). Validates the dict's keys."""
    if scaling is None:
        return "default", None
    rope_type, cfg = _normalise(scaling, dim)
    return rope_type, (_positive_int(cfg, _L0) if rope_type in ("dynamic", "longrope") else None)


def inv_freq(dim: int, base: float = 10000.0, scaling: dict | None = None, seq_len: int | None = None):
    """Rotary frequencies for a rotary dimension `dim` (even): `(inv_freq (dim/2,) float32, attention_factor)`.

    `seq_len` (the total length: offset + tokens) matters only for `dynamic` (the NTK base grows once it
    exceeds L0) and `longrope` (long factors once it exceeds L0). See the module docstring for formulas.
    Bad scaling dicts (unknown or missing keys, factor < 1, wrong-length short_factor, …) raise ValueError
    naming the key. Computed on the host whatever the default device (a model built on the meta device keeps
    these values to write back: `hybrid.computed_buffers`).
    """
    check_dim_base(dim, base)
    check_int("seq_len", seq_len, low=0, allow_none=True)
    with on_host():
        if scaling is None:
            return _default(int(dim), float(base)).to(torch.float32), 1.0
        rope_type, cfg = _normalise(scaling, int(dim))
        theta, attn = _SCHEDULES[rope_type](int(dim), float(base), cfg, seq_len)
        return theta.to(torch.float32), float(attn)
