"""The decode step recorded once as a CUDA graph and replayed for every token (``generate(..., compile="cuda-graph")``).

An eager decode step is a few hundred small ops, each launched from Python: on a GPU the step is bound by the
launches, not by the arithmetic (docs/decoding.md). A CUDA graph launches the whole step at once. It replays
fixed kernels on fixed memory, so the step it records must keep its shapes and memory from token to token, and
must never read a value back to the host:

- the state is in the rows form (a ragged batch: every row at its own position, a tensor), where positions,
  cache slots and masks are tensors. A state that is not (a prompt decoded at one position) takes one eager step
  in the rows form first;
- a global attention cache attends over a fixed capacity of slots, the unwritten ones masked
  (``RowKVCache.fix``); ``capacity`` (by default twice what the state holds) grows by recording again;
- everything else (windows' rings, R / M / G states) already has a fixed size.

``GraphedStep`` keeps one graph per layout of state (batch size, capacity, dtypes) and a static state for each:
the state it returns *is* that static state, and the next call with it only copies the token in and replays.
Called with any other state (a new prompt, a batch after requests joined or left), it copies that state into
the graph of its layout, or records one. Like an eager step on a window's ring, a call consumes its state: the
state returned before is overwritten by the next replay (``clone()`` a state to keep it).

A graph serves the weights it was recorded with: after changing them in place (a training step), build a new
``GraphedStep`` (``generate`` builds one per call). Each token's logits are those of the eager step in the rows
form, up to float rounding (the same kernels, except a global cache masked over its capacity).
``recorder="traced"`` records on the CPU with ``make_fx`` instead, a stand-in that replays the same way and
refuses what a CUDA graph cannot hold (tests/models/decoding).

``compiled=True`` records the step as ``torch.compile(model, dynamic=False)`` runs it: Inductor fuses its
elementwise ops, so a replay launches fewer kernels (``compile="compiled-cuda-graph"``). The eager step is still
the one checked for what a graph cannot hold. Its CPU stand-in is ``recorder="rerun"``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from hybrid.checks import check_int, recording_graph
from hybrid.kernels.dynamo_limits import recompile_room

from .graph_recorders import RECORDERS
from .graph_state import StateLayout, copy_into, fix_caches, global_capacity, global_spans, is_rows_state, same_memory


class _Graph:
    """One recorded step over its static state, token and logits (``compiled``: the step is that
    ``torch.compile`` of ``model``; the eager ``model`` is its twin for the recorder's checks)."""

    def __init__(self, model, state, layout: StateLayout, token: Tensor, record, compiled=None):
        self.state = state
        self.layout = layout  # the state's
        self.tensors = list(self.layout.tensors)
        self.counters = self.layout.read_counters()
        self.capacity = global_capacity(state)
        self.token = token.clone()  # (B, 1)
        self.logits = torch.empty(token.shape[0], 1, model.config.vocab_size, dtype=model.embed.weight.dtype,
                                  device=token.device)  # (B, 1, V)
        self.advance = [0] * len(self.counters)

        def run(step=model if compiled is None else compiled) -> None:
            self.layout.put_back(self.tensors)
            self.layout.write_counters(self.counters)
            with recording_graph():
                logits, out = step(self.token, state=self.state)
            out_layout = StateLayout(out)
            if out_layout.key != self.layout.key:
                raise ValueError("state: expected a decode step that keeps the state's layout (a CUDA graph "
                                 "replays fixed memory), got one that changes it")
            for static, new in zip(self.tensors, out_layout.tensors):
                if not same_memory(static, new):
                    static.copy_(new)
            self.logits.copy_(logits)
            self.advance = [after - before for after, before in zip(out_layout.read_counters(), self.counters)]

        if compiled is None:
            self.replay = record(run, self.tensors)
        else:
            with _room_to_compile():
                self.replay = record(run, self.tensors, check=lambda: run(model))
        self.layout.put_back(self.tensors)
        self.layout.write_counters(self.counters)
        # what the step read from the modules' memos (an R layer's transition) stays alive for the replays, even
        # if a later eager step replaces a memo: a graph serves the weights it was recorded with
        self.memos = [module.__dict__["_step_memo"] for module in model.modules() if "_step_memo" in module.__dict__]

    def fits_one_more(self, state=None) -> bool:
        """The next token of ``state`` (default: the static one) fits this graph's global caches' capacity."""
        spans = global_spans(self.state if state is None else state)
        return not spans or (self.capacity is not None and max(spans) + 1 <= self.capacity)

    def load(self, layout: StateLayout) -> None:
        """Copy the state ``layout`` walked (laid out as this graph's: the same ``key``) into the static state."""
        copy_into(self.tensors, layout.tensors)
        self.counters = layout.read_counters()
        self.layout.write_counters(self.counters)  # the static state's own, which step advances

    def step(self, token: Tensor):
        """One replay; the static state's objects are pointed back at the graph's memory first (a row operation
        on a returned state, ``put`` say, may have pointed them elsewhere)."""
        self.layout.put_back(self.tensors)
        self.token.copy_(token)
        self.replay()
        # the state's counters, which a caller may have lowered since (bound_global_spans), advanced
        self.counters = [c + a for c, a in zip(self.layout.read_counters(), self.advance)]
        self.layout.write_counters(self.counters)
        return self.logits.clone(), self.state


def _room_to_compile():
    """Dynamo's limits while a compiled step is recorded. Each layout (batch size, capacity) compiles the model's
    step anew (``dynamic=False``), and past Dynamo's recompile limit (8 by default, for every model of a class
    together: one code object) the step would run eagerly without a word, and the graph would hold the eager
    kernels under a compiled step's name. So the limit is raised, and reaching it fails instead."""
    return recompile_room(64, fail_at_limit=True)


def _loads_in_place(graph: _Graph, state, given: StateLayout) -> bool:
    """``state`` (laid out as ``graph``'s static state) can be copied into it as it is, without a clone first: its
    global caches have room for the next token, and each tensor is either the static one itself (a cache that
    continuous batching wrote rows into, in place) or shares no memory with any static one (so no copy reads
    what an earlier copy wrote). Continuous batching over global attention then copies the new rows' states, not
    the whole cache twice."""
    if not graph.fits_one_more(state):
        return False
    static = {t.untyped_storage().data_ptr() for t in graph.tensors}
    return all(same_memory(s, g) or g.untyped_storage().data_ptr() not in static
               for s, g in zip(graph.tensors, given.tensors))


class GraphedStep:
    """``step(token (B, 1), state=state)`` -> (logits ``(B, 1, V)``, next state), replayed from a recorded graph
    (see the module docstring). ``recorder``: "cuda" (a CUDA graph; the model on a CUDA device), "traced" (the
    CPU stand-in) or "rerun" (the CPU stand-in for a compiled step); ``capacity``: the slots of a global
    attention cache's graph (default: twice the state's span, doubled again when a row reaches it; a graph of a
    larger capacity replaces the batch size's smaller ones);
    ``max_graphs``: graphs kept, the oldest dropped first; ``compiled``: record the step as ``torch.compile``
    (``dynamic=False``) runs it, its elementwise ops fused by Inductor, so that the graph launches fewer kernels
    (True, or a dict of ``torch.compile`` options; each graph's layout compiles once, before its recording)."""

    def __init__(self, model, recorder: str = "cuda", capacity: int | None = None, max_graphs: int = 8,
                 compiled: bool | dict = False):
        if recorder not in RECORDERS:
            raise ValueError(f"recorder: expected one of {sorted(RECORDERS)}, got {recorder!r}")
        if not isinstance(compiled, (bool, dict)):
            raise ValueError(f"compiled: expected True, False or a dict of torch.compile options, got {compiled!r}")
        if compiled is not False and recorder == "traced":
            raise ValueError("compiled: expected the 'cuda' or 'rerun' recorder (make_fx, the 'traced' stand-in, "
                             "does not trace a torch.compile'd step), got recorder 'traced'")
        device = model.embed.weight.device
        if recorder == "cuda" and device.type != "cuda":
            raise ValueError(f"compile: 'cuda-graph' records the decode step as a CUDA graph and needs the model "
                             f"on a CUDA device, got one on {device.type}")
        self.model, self.record = model, RECORDERS[recorder]
        options = {} if compiled is True else compiled or None
        self.compiled = None if options is None else torch.compile(model, **{"dynamic": False, **options})
        self.capacity = check_int("capacity", capacity, low=1, allow_none=True)
        self.max_graphs = check_int("max_graphs", max_graphs, low=1)
        self.graphs: dict[tuple, _Graph] = {}
        self.live: _Graph | None = None  # the graph whose static state was returned last
        self.counts = {"eager": 0, "recorded": 0, "loaded": 0, "replayed": 0}

    @torch.no_grad()
    def __call__(self, token: Tensor, state=None):
        live = self.live
        if live is not None and state is live.state:
            if live.fits_one_more():
                self.counts["replayed"] += 1
                return live.step(token)
            self.graphs = {key: g for key, g in self.graphs.items() if g is not live}  # outgrown: drop it
        self.live = None
        if state is None or not is_rows_state(state):  # one eager step into the rows form
            self.counts["eager"] += 1
            return self.model(token, state=None if state is None else state.ragged_copy())
        layout = StateLayout(state)
        graph = self.graphs.get(layout.key)
        if graph is None or not _loads_in_place(graph, state, layout):  # (rows put into a returned state load)
            prepared = state.clone()
            spans = global_spans(prepared)
            if spans:  # global caches: the next token's slot must fit, in a graph of this batch size with room
                needed = max(spans) + 1
                roomy = [g.capacity for g in self.graphs.values()
                         if g.token.shape[0] == token.shape[0] and (g.capacity or 0) >= needed]
                fix_caches(prepared, max(roomy) if roomy else
                           self.capacity if self.capacity and self.capacity >= needed else 2 * needed)
            layout = StateLayout(prepared)
            graph = self.graphs.get(layout.key)
        if graph is None:
            capacity = global_capacity(prepared)
            if capacity is not None:  # a larger capacity replaces the smaller ones of this batch size (memory)
                smaller = lambda g: g.token.shape[0] == token.shape[0] and (g.capacity or 0) < capacity  # noqa: E731
                self.graphs = {key: g for key, g in self.graphs.items() if not smaller(g)}
            while len(self.graphs) >= self.max_graphs:
                self.graphs.pop(next(iter(self.graphs)))
            graph = _Graph(self.model, prepared, layout, token, self.record, self.compiled)
            self.graphs[layout.key] = graph
            self.counts["recorded"] += 1
        else:
            graph.load(layout)
            self.counts["loaded"] += 1
        self.live = graph
        self.counts["replayed"] += 1
        return graph.step(token)
