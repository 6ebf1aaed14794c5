"""Where rotary goes inside attention: `parse_placement("qk" | "vo" | ...)`.

Su's post "The second type of rotary position encoding" (VO-RoPE, 2025) compares these placements; with `R_m`
the rotation by position m and `a_ij` the attention weights:

| name   | q | k | v | o | relative? | what attention computes                       |
| ------ | - | - | - | - | --------- | --------------------------------------------- |
| `qk`   | ✓ | ✓ |   |   | yes       | `s_ij = q_iᵀ R_{j−i} k_j` (standard RoPE)     |
| `vo`   |   |   | ✓ | ✓ | yes       | `o_i = Σ_j a_ij R_{j−i} v_j` (VO-RoPE)        |
| `qkvo` | ✓ | ✓ | ✓ | ✓ | yes       | both of the above                             |
| `none` |   |   |   |   | yes       | NoPE (trivially position-free)                |
| `q`, `k`, `v`, `o`, `qkv` | … |   | no | absolute-position ablations     |

`o` means the inverse rotation `R_iᵀ` applied to the output by the *query's* position.
"""
from __future__ import annotations

from dataclasses import dataclass

_RELATIVE = ("qk", "vo", "qkvo", "none")
PLACEMENTS = ("qk", "vo", "qkvo", "q", "k", "v", "o", "qkv", "none")
_ALIASES = {"nope": "none"}


@dataclass(frozen=True)
class RotaryPlacement:
    """Which of q, k, v, o are rotated (o by the inverse rotation `R_iᵀ`)."""

    q: bool
    k: bool
    v: bool
    o: bool
    name: str
    is_relative: bool

    @property
    def any(self) -> bool:
        """True when at least one tensor is rotated (False for NoPE)."""
        return self.q or self.k or self.v or self.o


def parse_placement(spec) -> RotaryPlacement:
    """`"qk"`, `"vo"`, `"qkvo"`, `"q"`, `"k"`, `"v"`, `"o"`, `"qkv"` or `"none"` (alias `"nope"`), any case.

    A `RotaryPlacement` passes through unchanged. Anything else raises ValueError.
    """
    if isinstance(spec, RotaryPlacement):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"placement: expected a string, one of {PLACEMENTS}, got {spec!r}")
    name = spec.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in PLACEMENTS:
        raise ValueError(f"placement: expected one of {PLACEMENTS} (or 'nope'), got {spec!r}")
    letters = "" if name == "none" else name
    return RotaryPlacement(
        q="q" in letters, k="k" in letters, v="v" in letters, o="o" in letters,
        name=name, is_relative=name in _RELATIVE,
    )
