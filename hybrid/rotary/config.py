"""`RotaryConfig`: the rotary options every mixer shares (a model has one rotary schedule)."""
from __future__ import annotations

from dataclasses import dataclass

from hybrid.checks import check_bool, check_rotary_base

from .apply import check_layout
from .schedules import inv_freq


@dataclass(frozen=True)
class RotaryConfig:
    """Rotary options, validated on construction; errors name the field.

    base: θ_i = base^(−2i/R), > 1. scaling: a Llama/HF-style context-extension dict
    (`{"rope_type": "yarn", "factor": 4, ...}`, see `schedules`) or None. layout: how a head's channels pair up,
    "interleaved" (2k, 2k+1) or "half" (k, k + R/2). carope: context-aware phases (CARoPE) instead of the
    schedule, in attention and (by default) in the recurrence.
    """

    base: float = 10000.0
    scaling: dict | None = None
    layout: str = "interleaved"
    carope: bool = False

    def __post_init__(self):
        check_rotary_base("base", self.base)
        if self.scaling is not None and not isinstance(self.scaling, dict):
            raise ValueError(f"scaling: expected a dict or None, got {type(self.scaling).__name__}")
        check_layout("layout", self.layout)
        check_bool("carope", self.carope)
        if self.carope and self.scaling is not None:
            raise ValueError(f"carope: CARoPE has no context-extension scaling; expected scaling=None with "
                             f"carope=True, got {self.scaling!r}")

    def check_with(self, dim: int) -> None:
        """The options fit a mixer rotating `dim` channels per head: `scaling` is a valid dict for that
        rotary dimension (its keys, factors and per-pair lists)."""
        if self.scaling is None:
            return
        try:
            inv_freq(dim, self.base, self.scaling)
        except ValueError as e:  # inv_freq names most keys itself ("scaling['factor']: …"): no second prefix
            raise (e if str(e).startswith("scaling") else ValueError(f"scaling: {e}")) from None
