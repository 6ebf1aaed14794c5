"""The device a run uses: the names the configs and commands accept, and the torch device they resolve to.

    check_device("--device", "cuda:1")   # the name, or ValueError("--device: expected 'auto', 'cpu', …, got …")
    resolve_device("auto")               # this rank's GPU when CUDA is available, else the CPU
"""
from __future__ import annotations

import os

import torch

__all__ = ["DEVICE_NAMES", "check_device", "resolve_device", "env_int"]

DEVICE_NAMES = "'auto', 'cpu', 'cuda' or 'cuda:N'"


def env_int(name: str, default: int) -> int:
    """The integer in environment variable ``name`` (``default`` when unset); a ValueError naming it otherwise."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: expected an integer in the environment, got {value!r}") from None


def check_device(name: str, spec) -> str:
    """``spec`` when it is one of DEVICE_NAMES, else ``ValueError("{name}: expected …, got …")``."""
    if not isinstance(spec, str) or not (spec in ("auto", "cpu", "cuda") or spec.startswith("cuda:")):
        raise ValueError(f"{name}: expected {DEVICE_NAMES}, got {spec!r}")
    return spec


def resolve_device(spec: str = "auto") -> torch.device:
    """"auto" → this rank's GPU when CUDA is available, else the CPU; "cuda" → this rank's GPU (``LOCAL_RANK``)."""
    local_rank = env_int("LOCAL_RANK", 0)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {spec!r} was asked for, but this torch build sees no CUDA device; use --device cpu")
    if spec == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(spec)
