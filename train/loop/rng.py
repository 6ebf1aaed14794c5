"""The random generators' states a checkpoint holds, so a resumed run draws what the uninterrupted one would have:
Python's, numpy's, torch's CPU generator and (when initialised) CUDA's, as values ``torch.load(weights_only=True)``
reads back."""
from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict:
    """Python, numpy, torch CPU and (when initialised) CUDA generator states, as `weights_only`-safe values."""
    np_state = np.random.get_state(legacy=False)
    key = torch.from_numpy(np_state["state"]["key"].astype(np.int64))
    state = {
        "python": random.getstate(),
        "numpy": {"bit_generator": np_state["bit_generator"], "key": key, "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of `capture_rng_state` (CUDA states are restored when there are as many devices)."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
