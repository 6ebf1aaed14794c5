"""Will the model fit? The training state's size, estimated before any weight is allocated.

    check_fits(model_config, device)      # a ValueError with the estimate, before HybridLM(config) is built

The model is built on the ``meta`` device (shapes only, no memory), its parameters counted, and the training
state estimated as weights + gradients + AdamW's two moments: 16 bytes per parameter in float32 (and for a
float16 model, trained with float32 master weights), 8 in bfloat16. Activations come on top, so this is a
lower bound: a model refused here could never train, one accepted may still run out of memory at its first
step (then ``--batch-size``, ``--seq-len`` or ``--set recompute='"linear"'`` help). Under FSDP the state is
divided among the ranks.
"""
from __future__ import annotations

import os

import torch

__all__ = ["parameter_count", "training_bytes", "available_bytes", "check_fits"]


def parameter_count(config) -> int | None:
    """The parameters of ``HybridLM(config)``, counted without allocating them; None when there are more than
    int64 elements can count (the shapes overflow)."""
    from hybrid.models import HybridLM

    try:
        with torch.device("meta"):
            model = HybridLM(config)
    except RuntimeError as e:  # "Storage size calculation overflowed": astronomically large
        if "overflow" in str(e).lower():
            return None
        raise
    return sum(p.numel() for p in model.parameters())


def training_bytes(n_parameters: int, dtype: str = "float32") -> int:
    """Weights, gradients and AdamW's two moments (see the module)."""
    return n_parameters * (8 if dtype == "bfloat16" else 16)


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (a CUDA device's, or the machine's available RAM); None if unknown."""
    if device.type == "cuda":
        try:
            return torch.cuda.mem_get_info(device)[0]
        except RuntimeError:
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


def check_fits(config, device: torch.device, *, shards: int = 1) -> None:
    """A ValueError, with the estimate, when the training state of ``HybridLM(config)`` cannot fit in the free
    memory of ``device`` (``shards``: FSDP ranks sharing it)."""
    free = available_bytes(device)
    if free is None:
        return
    n = parameter_count(config)
    need = None if n is None else training_bytes(n, config.dtype) / max(shards, 1)
    if need is not None and need <= free:
        return
    what = ("more parameters than int64 can count" if n is None else
            f"{n:,} parameters, whose weights, gradients and AdamW moments need at least {_human(need)}")
    raise ValueError(
        f"model: expected a model that fits in the {_human(free)} free on {device}, got {what} (d_model "
        f"{config.d_model}, {config.n_layers} layers, vocab {config.vocab_size}); choose a smaller --size, "
        f"--d-model or --n-layers")
