"""AdamW with weight decay on the channel-mixing matrices only.

The rule: a parameter is decayed when it is the ``weight`` of an ``nn.Linear`` or ``nn.Embedding``
(projections, the SwiGLU MLP, the embedding and the LM head tied to it). Everything else is not:

- norm gains and biases (decay would pull a gain towards 0, i.e. switch the layer off);
- depthwise conv filters (one short filter per channel, a per-channel parameter like a bias);
- the mixers' dynamics parameters — the recurrence's ``decay_nu`` and learnable angles, the selective
  gates, CARoPE's frequency projection. Their value 0 is not "no effect" but a particular memory length,
  gate opening or frequency, so shrinking them towards 0 would bias the dynamics rather than regularise.

The rule is by module type, not by ``ndim``: the selective gates are 3-D tensors and ``decay_nu`` is 2-D,
yet neither is a matrix that mixes channels. A parameter shared by several modules (the tied embedding) is
counted once.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["param_groups", "build_optimizer", "set_weight_decay"]

DECAYED_MODULES = (nn.Linear, nn.Embedding)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups, ``decay`` and ``no_decay``, each with a ``names`` list (first name of each parameter)."""
    decayed = {id(m.weight) for m in model.modules() if isinstance(m, DECAYED_MODULES)}
    groups = {True: ([], []), False: ([], [])}
    for name, p in model.named_parameters():  # each shared parameter once, under its first name
        if not p.requires_grad:
            continue
        params, names = groups[id(p) in decayed]
        params.append(p)
        names.append(name)
    return [
        {"params": groups[True][0], "names": groups[True][1], "weight_decay": weight_decay, "group": "decay"},
        {"params": groups[False][0], "names": groups[False][1], "weight_decay": 0.0, "group": "no_decay"},
    ]


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW (torch's default foreach implementation) over ``param_groups(model, weight_decay)``."""
    groups = param_groups(model, weight_decay)
    for g in groups:
        del g["names"]  # keep the optimizer's state dict free of our bookkeeping
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas))


def set_weight_decay(optimizer: torch.optim.Optimizer, weight_decay: float) -> None:
    """``weight_decay`` on the ``decay`` group, 0 on ``no_decay`` (a group saved without its name: the first is
    ``decay``), e.g. a resume that changes it."""
    for i, group in enumerate(optimizer.param_groups):
        decayed = group.get("group", "decay" if i == 0 else "no_decay") == "decay"
        group["weight_decay"] = weight_decay if decayed else 0.0
