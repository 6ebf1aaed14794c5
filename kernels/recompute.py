"""Autograd inside a custom op's body: how an op's backward recomputes its forward and differentiates it.

An op registered with ``torch.library.custom_op`` is one opaque node to torch.compile. Its backward may itself be
a custom op that runs the forward again under autograd and takes the vector-Jacobian product: memory O(inputs)
between forward and backward, one extra forward of compute. The dispatcher runs an op's body with the autograd
dispatch keys excluded, so ``torch.enable_grad`` alone records nothing there; ``autograd_inside_op`` re-includes
them. ``recompute_vjp`` is the whole backward: the gradients of ``f`` at ``inputs`` for the wanted ones.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["autograd_inside_op", "recompute_vjp"]


def autograd_inside_op():
    """A context that turns autograd back on inside an op's body (everything else stays excluded: autocast is
    off). Private torch API: None where it is missing, and ``recompute_vjp`` then uses ``torch.func.vjp``."""
    try:
        exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
        return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)
    except AttributeError:  # pragma: no cover (a torch without the private guard)
        return None


def recompute_vjp(f: Callable[..., tuple[Tensor, ...]], inputs: Sequence[Tensor | None], wanted: Sequence[bool],
                  cotangents: Sequence[Tensor]) -> list[Tensor]:
    """The gradients of ``f(*inputs)`` (a tuple of outputs, one cotangent each) w.r.t. each input whose ``wanted``
    is set, as fresh contiguous tensors in the inputs' shapes (zeros where an output does not depend on it); an
    empty ``(0,)`` tensor for the others and for None inputs: a custom op returns tensors, never None, and its
    returns never alias one another or its inputs."""
    picked = [i for i, x in enumerate(inputs) if x is not None and wanted[i]]

    def on(*leaves):
        args = list(inputs)
        for i, x in zip(picked, leaves):
            args[i] = x
        return f(*args)

    grads = [None] * len(picked)
    guard = autograd_inside_op()
    if picked and guard is None:  # pragma: no cover
        grads = list(torch.func.vjp(on, *(inputs[i] for i in picked))[1](tuple(cotangents)))
    elif picked:
        with guard, torch.enable_grad():
            leaves = [inputs[i].detach().requires_grad_() for i in picked]
            pairs = [(y, g) for y, g in zip(on(*leaves), cotangents) if y.requires_grad]
            if pairs:
                grads = list(torch.autograd.grad([y for y, _ in pairs], leaves, [g for _, g in pairs],
                                                 allow_unused=True))
    like = next(x for x in inputs if x is not None)
    out = [like.new_empty(0) for _ in inputs]
    seen = {c.untyped_storage().data_ptr() for c in cotangents}  # a gradient passed straight through
    for i, g in zip(picked, grads):
        if g is None:
            g = torch.zeros_like(inputs[i], memory_format=torch.contiguous_format)
        elif g.untyped_storage().data_ptr() in seen:
            g = g.clone(memory_format=torch.contiguous_format)
        out[i] = g.contiguous()
    return out
