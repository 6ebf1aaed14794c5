"""What the context-parallel cases share: the registry, the sizes, the packings and the comparison."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from hybrid.kernels.context_parallel import shard_sequence

CASES: dict[str, Callable] = {}
L = 7  # tokens per rank: shards of an odd length; a sequence is L·world tokens
F64 = torch.float64


def case(name: str):
    """Register ``fn(group) -> {check: relative error}`` under ``name``."""
    def register(fn):
        if name in CASES:
            raise ValueError(f"case {name!r} registered twice")
        CASES[name] = fn
        return fn
    return register


def world_of(group) -> int:
    return dist.get_world_size(group)


def packings(world: int) -> dict[str, list[int]]:
    """Global document offsets for a sequence of L·world tokens: boundaries just before and after every shard
    edge (documents of two tokens across each edge), exactly at the edges, and one document across every shard
    (the middle shards pass the carry through) with documents of one token at the end."""
    T, edges = L * world, [L * k for k in range(1, world)]
    near = sorted({0, T, *[e - 1 for e in edges], *[e + 1 for e in edges]})
    return {"near-edges": near, "at-edges": [0, *edges, T], "across-all": [0, 2, T - 2, T - 1, T]}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max|got − want| / max(1, max|want|)``; inf on a shape mismatch."""
    if got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    got, want = got.detach(), want.detach()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1.0))


def summed(t: torch.Tensor, group) -> torch.Tensor:
    """The sum over the ranks (a parameter's or a whole-sequence input's gradient)."""
    t = t.detach().clone(memory_format=torch.contiguous_format)  # a collective reads the storage in order
    dist.all_reduce(t, group=group)
    return t


def compare(group, total: int, reference: Callable, sharded: Callable, seq: dict, whole: dict, *,
            cu: list[int] | None = None, seed: int = 0) -> dict[str, float]:
    """Run ``reference(**inputs)`` on the whole sequence and ``sharded(shard, **inputs)`` on this rank's shard;
    both return one tensor ``(B, T or L, …)``. ``seq``: per-token inputs ``(B, T, …)`` (sharded along dim 1);
    ``whole``: inputs about the whole sequence (the same on every rank). Errors of the output and of every
    input's gradient."""
    cu_t = None if cu is None else torch.tensor(cu)
    shard = shard_sequence(total, group, cu_seqlens=cu_t)
    ref_in = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in {**seq, **whole}.items()}
    want = reference(**ref_in)
    g = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(seed + 1))
    leaves = [k for k, v in ref_in.items() if v.requires_grad]
    ref_grads = dict(zip(leaves, torch.autograd.grad((want * g).sum(), [ref_in[k] for k in leaves],
                                                     allow_unused=True)))
    cp_in = {k: shard.take(v).detach().clone().requires_grad_(v.is_floating_point()) for k, v in seq.items()}
    cp_in.update({k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in whole.items()})
    got = sharded(shard, **cp_in)
    cp_grads = dict(zip(leaves, torch.autograd.grad((got * shard.take(g)).sum(), [cp_in[k] for k in leaves],
                                                    allow_unused=True)))
    errors = {"out": rel_err(got, shard.take(want))}
    for k in leaves:
        r, c = ref_grads[k], cp_grads[k]
        r = torch.zeros_like(ref_in[k]) if r is None else r
        c = torch.zeros_like(cp_in[k]) if c is None else c
        errors[f"grad {k}"] = rel_err(c, shard.take(r)) if k in seq else rel_err(summed(c, group), r)
    return errors


def module_grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in module.named_parameters()}


def compare_module(group, make: Callable, x: torch.Tensor, call_one: Callable, call_shard: Callable, *,
                   cu: list[int] | None = None, seed: int = 0) -> dict[str, float]:
    """A module (``make()`` builds the same one on every rank) on the whole input ``x`` ``(B, T, …)`` and on this
    rank's shard of it: the output, the input's gradient and every parameter's gradient (summed over the ranks)."""
    cu_t = None if cu is None else torch.tensor(cu)
    shard = shard_sequence(x.shape[1], group, cu_seqlens=cu_t)
    one, cp = make(), make()
    cp.load_state_dict(one.state_dict())
    x_one = x.detach().clone().requires_grad_(x.is_floating_point())
    want = call_one(one, x_one, cu_t)
    g = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(seed + 1))
    (want * g).sum().backward()
    x_cp = shard.take(x).detach().clone().requires_grad_(x.is_floating_point())
    got = call_shard(cp, x_cp, shard)
    (got * shard.take(g)).sum().backward()
    errors = {"out": rel_err(got, shard.take(want))}
    if x.is_floating_point():
        errors["grad x"] = rel_err(x_cp.grad, shard.take(x_one.grad))
    grads_one, grads_cp = module_grads(one), module_grads(cp)
    worst = max(((rel_err(summed(grads_cp[n], group), grads_one[n]), n) for n in grads_one), default=(0.0, ""))
    errors["grad params (worst)"] = worst[0]
    errors["params with a gradient"] = float(sum(bool(v.abs().max() > 0) for v in grads_one.values())) \
        - float(len(grads_one))  # 0 when every parameter took part (a check that the test sees them all)
    return errors
