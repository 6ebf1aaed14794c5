"""`AttentionState`, the decode state of an attention layer, and its row operations (`hybrid.mixer`'s state API).

Two forms. Uniform (every row at one position, an int `offset`): a `KVCache` (global) or `RingKVCache` (window)
with one `length` for the batch. Rows (a ragged batch, `offset` a `(B,)` tensor): a `RowKVCache`, one length per
row. `cat` of states at different positions or lengths gives the rows form, and so does every call with per-row
positions (`hybrid.attention_rows`); a uniform state converts by copying its entries once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .batch_state import check_keep, check_rows
from .kv_cache import KVCache, RingKVCache, RowKVCache


@dataclass
class AttentionState:
    """Decode state of one `Attention` layer.

    k: `(B, S, G, D)` rotated keys, or with shared-KV the one tensor `R_j c_j` (key and value); None
       before the first token. `S` = `length` without a window, `w` (ring slots) with one.
    v: `(B, S, G, D)` rotated values; None with shared-KV.
    length: tokens held in the cache (≤ w); with `offset` the position the caller continues at (the tokens
       seen), they are positions `offset − length … offset − 1`. An empty state continued at `offset = c`
       starts the sequence at position c.
    phase: `(B, G, P)` float32 CARoPE phase after the last token; None without CARoPE.
    cache: the `KVCache` / `RingKVCache` behind `k`, `v` (`k`, `v` are its entries), or None. `nbytes` counts
       the cached entries; a growing `KVCache` may hold up to twice that while it grows.
    batch: the number of rows of a state that holds no tensor yet (`init_state`), else None.

    The rows form (a ragged batch, `hybrid.attention_rows`): `cache` a `RowKVCache`, `length` an int64 tensor
    `(B,)` (row b holds its positions `offset[b] − length[b] … offset[b] − 1`), `k`, `v` the cache's slots. `cat`
    of states at different positions or lengths gives it, and so does every call with per-row positions.
    Row operations (`hybrid.mixer`): `select`, `put` and `rewind` copy rows or write slots in place; `fork` of a
    global rows cache shares it (its rewind truncates), of a window's ring copies the ring.
    """

    k: Tensor | None = None
    v: Tensor | None = None
    length: int | Tensor = 0
    phase: Tensor | None = None
    cache: KVCache | RingKVCache | RowKVCache | None = None
    batch: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.phase) if t is not None)

    @property
    def batch_size(self) -> int | None:
        """Rows of the batch (None for an empty state built without `init_state`)."""
        for t in (self.k, self.phase, self.length):
            if isinstance(t, Tensor):
                return t.shape[0]
        return self.batch

    @classmethod
    def cat(cls, states: list["AttentionState"]) -> "AttentionState":
        """The states of several sequences as one batch (rows in order); the caches are copied into one new
        cache. States at one position and cache length give a uniform state, others the rows form."""
        first = states[0]
        where = lambda s: (s.length, s.cache.end if isinstance(s.cache, RingKVCache) else None)  # noqa: E731
        if any(s.k is None for s in states) or any(is_rows(s) or where(s) != where(first) for s in states):
            return cat_rows(states)
        cat = lambda ts: None if ts[0] is None else torch.cat(ts)  # noqa: E731
        k, v, phase = cat([s.k for s in states]), cat([s.v for s in states]), cat([s.phase for s in states])
        cache = None
        if isinstance(first.cache, RingKVCache):
            cache = RingKVCache(k, v, first.cache.end)
        elif isinstance(first.cache, KVCache):
            cache = KVCache.from_prefix(k, v)
            k, v = cache.keys, cache.values
        return cls(k=k, v=v, length=first.length, phase=phase, cache=cache)

    def clone(self) -> "AttentionState":
        """A copy sharing no storage: continuing it leaves this state valid, and the other way round. The copy of
        a consumed windowed state (its ring written past it) keeps the ring's position, so continuing it raises
        as continuing the state itself would."""
        copy = lambda t: None if t is None else t.clone()  # noqa: E731
        if is_rows(self):
            cache = self.cache.clone()
            return AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=copy(self.phase),
                                  cache=cache)
        k, v, cache = copy(self.k), copy(self.v), None
        if isinstance(self.cache, RingKVCache):
            cache = RingKVCache(k, v, self.cache.end)
        return AttentionState(k=k, v=v, length=self.length, phase=copy(self.phase), cache=cache, batch=self.batch)

    def select(self, index: Tensor) -> "AttentionState":
        """Rows `index` `(n,)` as a new state (copied)."""
        return select_rows(self, index)

    def put(self, rows: Tensor, source: "AttentionState") -> "AttentionState":
        """Rows `rows` replaced by `source`'s rows, written into this batch's cache slots in place (rows form)."""
        return put_rows(self, rows, source, window_of(self if self.k is not None else source))

    def fork(self) -> "AttentionState":
        """A rollback point for `rewind` (see the class docstring)."""
        return fork_rows(self)

    def rewind(self, keep: Tensor, fork: "AttentionState") -> "AttentionState":
        """Rows where `keep` `(B,)` is False back to `fork`; a global cache is truncated by length."""
        return rewind_rows(self, keep, fork)


def is_rows(state) -> bool:
    """The state is in the rows form (one length per row)."""
    return isinstance(state.cache, RowKVCache)


def to_rows(state, window: int | None):
    """A uniform state with entries as a rows-form state (its entries copied)."""
    if is_rows(state) or state.k is None:
        return state
    B, L = state.k.shape[0], state.length
    lengths = torch.full((B,), L, dtype=torch.long, device=state.k.device)
    copy = lambda t: None if t is None else t.clone()  # noqa: E731
    if window is None:
        v = None if state.v is None else state.v[:, :L].clone()
        cache = RowKVCache(state.k[:, :L].clone(), v, lengths, None, L)
    else:
        cache = RowKVCache(copy(state.k), copy(state.v), lengths, window, window)
    return AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=copy(state.phase), cache=cache)


def to_uniform(state, offset: int):
    """A one-row rows-form state continued at the int position `offset` as a uniform state (entries copied): how a
    row of a ragged batch enters a packed forward."""
    if state.batch_size != 1:
        raise ValueError(f"state: expected a one-row state per packed sequence, got {state.batch_size} rows")
    c, L = state.cache, int(state.length[0])
    copy = lambda t: None if t is None else t.clone()  # noqa: E731
    if c.window is None:
        cache = KVCache.from_prefix(c.k[:, :L], None if c.v is None else c.v[:, :L])
        return AttentionState(k=cache.keys, v=cache.values, length=L, phase=copy(state.phase), cache=cache)
    cache = RingKVCache(c.k.clone(), copy(c.v), offset)
    return AttentionState(k=cache.k, v=cache.v, length=L, phase=copy(state.phase), cache=cache)


def window_of(state) -> int | None:
    """The window of a state with entries: a ring's slot count, None for a global cache."""
    if isinstance(state.cache, RowKVCache):
        return state.cache.window
    return state.cache.window if isinstance(state.cache, RingKVCache) else None


# ------------------------------------------------------------------------------------------ row operations


def cat_rows(states: list):
    """`AttentionState.cat` for states at different positions or lengths: one rows-form state (entries copied)."""
    full = [s for s in states if s.k is not None]
    phase = None if states[0].phase is None else torch.cat([s.phase for s in states])
    if not full:
        return AttentionState(phase=phase, batch=sum(s.batch_size for s in states))
    template = full[0]
    window = window_of(template)
    parts = [to_rows(s, window) for s in states]
    G, D = template.k.shape[2:]
    span = window or max(p.cache.span for p in parts if p.k is not None)
    B = sum(s.batch_size for s in states)
    shared = template.v is None
    k = template.k.new_zeros(B, span, G, D)  # (B, S, G, D)
    v = None if shared else torch.zeros_like(k)
    lengths, row = [], 0
    for p in parts:
        n = p.batch_size
        if p.k is not None:
            S = window or p.cache.span  # a fixed cache's keys are its whole buffer: the slots past span are empty
            k[row:row + n, :S] = p.cache.keys[:, :S]
            if v is not None:
                v[row:row + n, :S] = p.cache.values[:, :S]
            lengths.append(p.length.to(k.device))
        else:
            lengths.append(torch.zeros(n, dtype=torch.long, device=k.device))
        row += n
    cache = RowKVCache(k, v, torch.cat(lengths), window, span)
    return AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=phase, cache=cache)


def select_rows(state, index: Tensor):
    """`AttentionState.select`: rows `index` as a new state (entries copied)."""
    index = check_rows("index", index, state.batch_size)
    pick = lambda t: None if t is None else t.index_select(0, index.to(t.device))  # noqa: E731
    phase = pick(state.phase)
    if state.k is None:
        return AttentionState(phase=phase, batch=index.numel())
    if is_rows(state):
        c = state.cache
        lengths = pick(c.lengths)
        span = c.window or (int(lengths.max()) if lengths.numel() else 0)
        keys, values = c.keys[:, :span], None if c.v is None else c.values[:, :span]
        cache = RowKVCache(pick(keys), pick(values), lengths, c.window, span)
        return AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=phase, cache=cache)
    if isinstance(state.cache, RingKVCache):
        cache = RingKVCache(pick(state.k), pick(state.v), state.cache.end)
        return AttentionState(k=cache.k, v=cache.v, length=state.length, phase=phase, cache=cache)
    if state.cache is None:  # entries without their cache object: taken as they are
        return AttentionState(k=pick(state.k), v=pick(state.v), length=state.length, phase=phase)
    L = state.length
    cache = KVCache.from_prefix(pick(state.k[:, :L]), None if state.v is None else pick(state.v[:, :L]))
    return AttentionState(k=cache.keys, v=cache.values, length=L, phase=phase, cache=cache)


def put_rows(state, rows: Tensor, source, window: int | None):
    """`AttentionState.put`: rows `rows` replaced by `source`'s rows, written into this batch's slots in place."""
    rows = check_rows("rows", rows, state.batch_size)
    if source.batch_size != rows.numel():
        raise ValueError(f"source: expected an AttentionState of {rows.numel()} rows, got {source.batch_size} rows")
    phase = state.phase
    if phase is not None:
        phase = phase.index_copy(0, rows.to(phase.device), source.phase.to(phase.dtype))
    if source.k is None and state.k is None:
        return AttentionState(phase=phase, batch=state.batch_size)
    template = source if state.k is None else state
    G, D = template.k.shape[2:]
    if state.k is None:
        cache = RowKVCache.empty(state.batch_size, G, D, window, template.v is None, template.k.dtype, template.k.device)
    else:
        cache = (to_rows(state, window) if not is_rows(state) else state).cache
    src = to_rows(source, window)
    rows = rows.to(cache.k.device)
    if src.k is None:
        src_lengths = torch.zeros(rows.numel(), dtype=torch.long, device=cache.k.device)
    else:
        S = src.cache.keys.shape[1]
        if window is None:
            cache.reserve(S)
            cache.span = max(cache.span, S)
        cache.k[rows, :S] = src.cache.keys.to(cache.k.dtype)
        if cache.v is not None:
            cache.v[rows, :S] = src.cache.values.to(cache.v.dtype)
        src_lengths = src.length.to(cache.k.device)
    cache.lengths = cache.lengths.index_copy(0, rows, src_lengths)
    return AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=phase, cache=cache)


def fork_rows(state):
    """`AttentionState.fork`: a rollback point. A global rows cache is truncated on rewind, so the fork shares it
    (no copy); a window's ring is overwritten by the continuation, so the fork is a copy of it."""
    if is_rows(state) and state.cache.window is None:
        return AttentionState(k=state.k, v=state.v, length=state.length, phase=state.phase, cache=state.cache)
    return state.clone()


def rewind_rows(state, keep: Tensor, fork):
    """`AttentionState.rewind`: rows where `keep` is False back to `fork`. A global cache is truncated (each row's
    length lowered; the entries past it are masked, then overwritten), a ring is taken row by row from the fork's
    copy."""
    keep = check_keep(keep, state.batch_size)
    phase = None if state.phase is None else torch.where(keep[:, None, None].to(state.phase.device), state.phase,
                                                         fork.phase)
    if is_rows(state) and state.cache.window is None and fork.cache is state.cache:
        cache = state.cache
        cache.lengths = torch.where(keep.to(cache.lengths.device), state.length, fork.length)
        return AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=phase, cache=cache)
    if is_rows(state) and state.cache.window is not None and is_rows(fork):
        c, f = state.cache, fork.cache
        where = keep.to(c.k.device)[:, None, None, None]
        cache = RowKVCache(torch.where(where, c.k, f.k), None if c.v is None else torch.where(where, c.v, f.v),
                           torch.where(keep.to(c.k.device), c.lengths, f.lengths), c.window, c.span)
        return AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=phase, cache=cache)
    back = (~keep).nonzero().flatten()  # the general way: the rows to roll back, copied from the fork
    if back.numel() == 0:
        return state
    out = put_rows(state, back, select_rows(fork, back), window_of(state if state.k is not None else fork))
    out.phase = phase
    return out
