"""Recording a decode step once and replaying it: a CUDA graph, or its CPU stand-in for tests and dry runs.

``record(run, tensors, check)`` returns ``replay()``. ``run()`` is one decode step on fixed tensors; recording
leaves ``tensors`` (the static state's) as they were, and each ``replay()`` then does what ``run()`` did, on
whatever the tensors hold by then, with none of its Python. ``check()`` is the same step run eagerly: ``run``
itself, or, when ``run`` calls a ``torch.compile``d model, its eager twin (Dynamo compiles nothing under the
dispatch mode that looks for what a capture cannot hold, so the eager step is the one looked at).

- ``record_cuda_graph``: ``torch.cuda.CUDAGraph``. One warm-up of ``check`` first, on a side stream (lazy
  initialisation, the Triton kernels' first compile), which refuses what a capture could not hold as the stand-in
  does; then, for a compiled ``run``, one warm-up of ``run`` (Dynamo's and Inductor's compile, outside the
  capture). Their writes are undone from a snapshot, and the capture itself runs nothing.
- ``record_traced``: the CPU stand-in. ``make_fx`` traces ``run()`` into a graph of aten ops whose constants are
  the same tensors (the same memory), which a replay reads and writes as a CUDA graph would. A step that a CUDA
  graph could not hold raises: one that reads a tensor back (a host sync), builds a tensor from host data (a copy
  from the host), or has an output of data-dependent shape. A step whose Python decides on values would replay
  its first decision: the tests compare replays with eager steps.
- ``record_rerun``: the CPU stand-in for a compiled step, which ``make_fx`` cannot trace. It looks at the eager
  twin as the CUDA recorder does, then each ``replay()`` runs the step again, its Python included (a compiled
  step may compile again when a host counter it read has moved; a CUDA graph keeps the first recording).
"""
from __future__ import annotations

import os
import traceback
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from .graph_state import copy_into

# ops a CUDA graph cannot hold, with what they mean
_HOST_OPS = {
    "_local_scalar_dense": "reads a tensor back to the host (a sync)",
    "lift_fresh_copy": "builds a tensor from host data (a copy from the host)",
    "nonzero": "has an output of data-dependent shape",
    "masked_select": "has an output of data-dependent shape",
    "unique": "has an output of data-dependent shape",
}


def record_cuda_graph(run: Callable[[], None], tensors: list[Tensor],
                      check: Callable[[], None] | None = None) -> Callable[[], None]:
    """``run`` recorded as a CUDA graph (``check``: its eager twin, if ``run`` is compiled); returns its
    ``replay``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _warm_up(run, tensors, check)  # outside the capture, where a sync would break it with a CUDA error instead
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def record_traced(run: Callable[[], None], tensors: list[Tensor],
                  check: Callable[[], None] | None = None) -> Callable[[], None]:
    """``run`` traced into an aten graph over the same tensors (the CPU stand-in); returns its ``replay``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if check is not None and check is not run:
        raise ValueError("recorder: 'traced' records an eager step (make_fx does not trace a torch.compile'd "
                         "one), got a compiled step")

    snapshot = [t.clone() for t in tensors]

    def traced() -> Tensor:
        run()
        return torch.zeros(())  # make_fx wants a tensor out

    try:
        graph = make_fx(traced)()
    except RuntimeError as e:  # make_fx refuses some reads back itself
        if "_local_scalar_dense" not in str(e):
            raise
        copy_into(tensors, snapshot)
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f"{os.sep}torch{os.sep}" not in f.filename]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None
        raise _refusal("_local_scalar_dense", where) from None
    copy_into(tensors, snapshot)
    for node in graph.graph.nodes:
        name = getattr(getattr(node.target, "_schema", None), "name", "").removeprefix("aten::")
        if name in _HOST_OPS:
            raise _refusal(name, None)
    return lambda: graph()


def record_rerun(run: Callable[[], None], tensors: list[Tensor],
                 check: Callable[[], None] | None = None) -> Callable[[], None]:
    """The stand-in for a compiled step (see the module docstring); returns ``run`` itself as the replay."""
    _warm_up(run, tensors, check)
    return run


def _warm_up(run: Callable[[], None], tensors: list[Tensor], check: Callable[[], None] | None) -> None:
    """The eager step (``check``, else ``run``) under ``_RefuseHostOps``, then a compiled ``run`` once (its compile);
    ``tensors`` are left as they were after each."""
    snapshot = [t.clone() for t in tensors]
    with _RefuseHostOps():
        (check or run)()
    copy_into(tensors, snapshot)
    if check is not None and check is not run:
        run()
        copy_into(tensors, snapshot)


class _RefuseHostOps(TorchDispatchMode):
    """Raises ``_refusal`` at the first op a CUDA graph cannot hold."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = host_traffic(func, args, out)
        if op is not None:
            here = os.path.abspath(__file__)
            frames = [f for f in traceback.extract_stack()
                      if f"{os.sep}torch{os.sep}" not in f.filename and os.path.abspath(f.filename) != here]
            raise _refusal(op, f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None)
        return out


def host_traffic(func, args, out) -> str | None:
    """Why a CUDA graph could not hold this call of the aten op ``func`` (its ``args`` and ``out``), as a key of
    ``_HOST_OPS`` ("lift_fresh_copy" for a copy of a host tensor to the device), or None if it could. The one
    judgement of ``_RefuseHostOps`` and of the CPU test that runs each preset's steps on the meta device
    (tests/models/test_host_traffic.py)."""
    name = func._schema.name.removeprefix("aten::")
    if name in _HOST_OPS:
        return name
    host_in = any(isinstance(a, Tensor) and a.device.type == "cpu" and a.dim() for a in args)
    if name in ("_to_copy", "copy_") and host_in and isinstance(out, Tensor) and out.device.type != "cpu":
        return "lift_fresh_copy"
    return None


def _refusal(op: str, where: str | None) -> ValueError:
    at = f", at {where}" if where else ""
    return ValueError(f"step: expected a decode step a CUDA graph can hold, got one that {_HOST_OPS[op]} "
                      f"(aten.{op}{at})")


RECORDERS = {"cuda": record_cuda_graph, "traced": record_traced, "rerun": record_rerun}
