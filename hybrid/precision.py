"""The compute dtype of the building blocks: angles, gates and recurrent states in float32 at least."""
from __future__ import annotations

import torch


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is a low-precision float (bfloat16, float16); float32 and float64 unchanged
    (float64 keeps the reference checks exact)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))
