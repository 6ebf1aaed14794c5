"""The KV cache objects behind `AttentionState`: storage plus the bookkeeping that lets decoding write in place.

Each has one `update(k, v)` that stores new rotated keys/values `(B, T, G, D)` (v None with shared-KV) and
returns the cache to attend over. `update` writes in place when autograd records nothing (decoding, no-grad
prefill) and returns `self`; when the new entries or the storage require grad it returns a new cache built out
of place, since autograd cannot record a write into a tensor that an earlier call saved for backward.

- `KVCache` (global attention): a growable buffer holding positions in order, `filled` of them valid. Several
  states of one decoding stream share it; a state whose `length` equals `filled` is the newest and appends in
  place (amortised O(T) per call); an older state copies its prefix into a fresh buffer first, so branching
  from any earlier state stays valid (copy on write).
- `RowKVCache` (a ragged batch): one row per sequence at its own position, global or windowed, written at each
  row's own slot (its length, or `p mod w`); its `attend` returns the keys and the per-row mask as well.
- `RingKVCache` (sliding window w): `w` slots, token p at slot `p % w`, written once per token. Writing
  position p overwrites p − w, which an older state may still need, so only the newest state may continue from
  a ring: `Attention` compares `end` with the position (`offset`) the caller continues at, and refuses an older
  state with a message pointing at `AttentionState.clone()` / `HybridState.clone()`.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _records_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _with_capacity(t: Tensor, capacity: int) -> Tensor:
    """A `(B, capacity, G, D)` tensor starting with t `(B, n, G, D)`; the rest uninitialised."""
    out = t.new_empty(t.shape[0], capacity, *t.shape[2:])
    out[:, : t.shape[1]] = t
    return out


class KVCache:
    """Global cache: k, v `(B, capacity, G, D)` (v None with shared-KV), the first `filled` slots valid."""

    def __init__(self, k: Tensor, v: Tensor | None, filled: int):
        self.k, self.v, self.filled = k, v, filled

    @classmethod
    def from_prefix(cls, k: Tensor, v: Tensor | None, capacity: int | None = None) -> "KVCache":
        """A cache holding k, v `(B, L, G, D)` (copied; room for `capacity` ≥ L entries)."""
        capacity = k.shape[1] if capacity is None else max(capacity, k.shape[1])
        return cls(_with_capacity(k, capacity), None if v is None else _with_capacity(v, capacity), k.shape[1])

    @property
    def keys(self) -> Tensor:
        return self.k[:, : self.filled]  # (B, filled, G, D)

    @property
    def values(self) -> Tensor | None:
        return None if self.v is None else self.v[:, : self.filled]  # (B, filled, G, D)

    def update(self, k: Tensor, v: Tensor | None) -> "KVCache":
        """Append k, v `(B, T, G, D)`: in place with geometric growth, or out of place under autograd."""
        T = k.shape[1]
        if _records_grad(k, v, self.k, self.v):
            cat = lambda old, new: torch.cat([old[:, : self.filled], new], dim=1)  # noqa: E731  (B, filled + T, G, D)
            return KVCache(cat(self.k, k), None if v is None else cat(self.v, v), self.filled + T)
        needed = self.filled + T
        if self.k.shape[1] < needed:  # grow: copy the filled prefix once
            capacity = max(2 * self.k.shape[1], needed)
            self.k = _with_capacity(self.k[:, : self.filled], capacity)
            self.v = None if self.v is None else _with_capacity(self.v[:, : self.filled], capacity)
        self.k[:, self.filled : needed] = k
        if v is not None:
            self.v[:, self.filled : needed] = v
        self.filled = needed
        return self


class RingKVCache:
    """Sliding-window cache: k, v `(B, w, G, D)` (v None with shared-KV); positions `< end` written, slot s
    holding the largest such p with `p ≡ s (mod w)`."""

    def __init__(self, k: Tensor, v: Tensor | None, end: int):
        self.k, self.v, self.end = k, v, end

    @classmethod
    def empty(cls, like: Tensor, window: int, shared: bool, end: int) -> "RingKVCache":
        """Zeroed slots for keys like `like` `(B, T, G, D)`, no position written before `end`."""
        B, _, G, D = like.shape
        k = like.new_zeros(B, window, G, D)  # (B, w, G, D)
        return cls(k, None if shared else torch.zeros_like(k), end)

    @property
    def window(self) -> int:
        return self.k.shape[1]

    def positions(self) -> Tensor:
        """`(w,)` int64: the position each slot holds, `p = end − 1 − ((end − 1 − s) mod w)`."""
        s = torch.arange(self.window, device=self.k.device)
        return self.end - 1 - torch.remainder(self.end - 1 - s, self.window)

    def last(self, n: int) -> tuple[Tensor, Tensor | None]:
        """The last n ≤ w written positions `end − n … end − 1`, in position order: `(B, n, G, D)` copies."""
        slots = torch.remainder(torch.arange(self.end - n, self.end, device=self.k.device), self.window)  # (n,)
        return self.k.index_select(1, slots), None if self.v is None else self.v.index_select(1, slots)

    def update(self, k: Tensor, v: Tensor | None) -> "RingKVCache":
        """Write k, v `(B, T, G, D)` at positions `end … end + T − 1` (only the last w survive): in place, or
        out of place under autograd."""
        T, w = k.shape[1], self.window
        n = min(T, w)
        slots = torch.remainder(torch.arange(self.end + T - n, self.end + T, device=self.k.device), w)  # (n,)
        new_k, new_v = k[:, T - n :].to(self.k.dtype), None if v is None else v[:, T - n :].to(self.k.dtype)
        if _records_grad(k, v, self.k, self.v):
            ring_v = None if v is None else self.v.index_copy(1, slots, new_v)
            return RingKVCache(self.k.index_copy(1, slots, new_k), ring_v, self.end + T)
        self.k.index_copy_(1, slots, new_k)
        if v is not None:
            self.v.index_copy_(1, slots, new_v)
        self.end += T
        return self


class RowKVCache:
    """One cache row per sequence, each at its own position (a ragged batch; vLLM's state slots): k, v
    `(B, S, G, D)` (v None with shared-KV), row b holding `lengths[b]` valid entries.

    - `window` None (global attention): row b's entries are its positions in order, in slots
      0 … lengths[b] − 1; S is a capacity, grown geometrically; `span` (a host int) bounds every length, so that
      no step reads the lengths back from the device. Rolling back is truncating: lowering a row's length.
    - `window` w: a ring of S = w slots, position p in slot p mod w (as `RingKVCache`), the last `lengths[b]` ≤ w
      positions valid.

    `attend` writes in place (out of place under autograd). The newest state on the cache is the one whose
    `length` is the tensor `lengths` (an identity, checked without a host sync): `Attention` refuses to continue
    an older one, which a write may have overwritten.

    `fixed` (a global cache, `fix(capacity)`): every call attends over all S slots, the unwritten ones masked,
    so a decode step's shapes stay the same from token to token (what a CUDA graph replays,
    `models/decoding/graphed_step.py`); `span` still bounds the lengths, and the buffer grows only past it.
    """

    def __init__(self, k: Tensor, v: Tensor | None, lengths: Tensor, window: int | None, span: int,
                 fixed: bool = False):
        self.k, self.v, self.lengths, self.window, self.span = k, v, lengths, window, span
        self.fixed = fixed

    @classmethod
    def empty(cls, batch: int, heads: int, head_dim: int, window: int | None, shared: bool, dtype, device) -> "RowKVCache":
        """No entries yet: `batch` rows of `heads` kv heads of `head_dim` channels."""
        k = torch.zeros(batch, window or 0, heads, head_dim, dtype=dtype, device=device)  # (B, w or 0, G, D)
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        return cls(k, None if shared else torch.zeros_like(k), lengths, window, 0)

    @property
    def keys(self) -> Tensor:
        return self.k if self.window or self.fixed else self.k[:, : self.span]  # (B, S, G, D)

    @property
    def values(self) -> Tensor | None:
        return None if self.v is None else (self.v if self.window or self.fixed else self.v[:, : self.span])

    def fix(self, capacity: int) -> None:
        """Attend over `capacity` slots from now on (a global cache; at least `span`): the buffer is resized to
        exactly that once, the slots past `span` zero-filled (see `reserve`), and stays until a call needs more.
        Exactly: a buffer grown geometrically may hold twice the entries, and every step would read them all."""
        if self.window:
            return
        capacity = max(capacity, self.span)
        if self.k.shape[1] != capacity:
            self._resize(capacity)
        self.fixed = True

    def reserve(self, capacity: int) -> None:
        """Room for `capacity` entries per row (global cache; copies the filled part once when it grows). The new
        slots are zeros: a row attends over every slot, masked, and a masked NaN (uninitialised memory) would
        still poison the weighted sum (0 · NaN)."""
        if self.window or self.k.shape[1] >= capacity:
            return
        self._resize(max(capacity, 2 * self.k.shape[1]))

    def _resize(self, capacity: int) -> None:
        """`capacity` ≥ `span` slots: the first `span` kept, the rest zeros."""
        grow = lambda t: torch.cat([t[:, : self.span], t.new_zeros(t.shape[0], capacity - self.span, *t.shape[2:])],
                                   dim=1)  # noqa: E731  (B, capacity, G, D)
        self.k = grow(self.k)
        self.v = None if self.v is None else grow(self.v)

    def attend(self, k: Tensor, v: Tensor | None, offset: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
        """Store k, v `(B, T, G, D)` of row b's positions `offset[b] … offset[b] + T − 1` and return what their
        queries attend over: keys, values `(B, S', G, D)` and the mask `(B, T, S')` (True = attend)."""
        T, w = k.shape[1], self.window
        k, v = k.to(self.k.dtype), None if v is None else v.to(self.k.dtype)
        t = torch.arange(T, device=k.device)
        grad = _records_grad(k, v, self.k, self.v)
        if w is None:  # write at each row's own length, then attend causally over the row's entries
            self.reserve(self.span + T)
            slots = self.lengths[:, None] + t  # (B, T)
            self.k, self.v = _scatter(self.k, slots, k, grad), None if v is None else _scatter(self.v, slots, v, grad)
            self.span += T
            j = torch.arange(self.keys.shape[1], device=k.device)
            mask = j[None, None, :] <= slots[:, :, None]  # (B, T, S): entries up to the query's own
            self.lengths = self.lengths + T
            return self.keys, self.values, mask
        if T == 1:  # decode: write first; the ring then holds the query's window
            slot = torch.remainder(offset, w)[:, None]  # (B, 1)
            self.k, self.v = _scatter(self.k, slot, k, grad), None if v is None else _scatter(self.v, slot, v, grad)
            self.lengths = torch.clamp(self.lengths + 1, max=w)
            age = torch.remainder(offset[:, None] - torch.arange(w, device=k.device), w)  # (B, w): age of slot s
            return self.k, self.v, (age < self.lengths[:, None])[:, None, :]  # (B, 1, w)
        # chunk: the ring before this call, then the new entries (a write would overwrite keys earlier queries need)
        age = torch.remainder(offset[:, None] - 1 - torch.arange(w, device=k.device), w)  # (B, w)
        old_pos = torch.where(age < self.lengths[:, None], offset[:, None] - 1 - age, -(1 << 62))  # invalid: far past
        key_pos = torch.cat([old_pos, offset[:, None] + t], dim=1)  # (B, w + T)
        query_pos = offset[:, None] + t  # (B, T)
        delta = query_pos[:, :, None] - key_pos[:, None, :]  # (B, T, w + T)
        mask = (delta >= 0) & (delta < w)
        keys = torch.cat([self.k, k], dim=1)  # (B, w + T, G, D)
        values = None if v is None else torch.cat([self.v, v], dim=1)
        n = min(T, w)
        slots = torch.remainder(query_pos[:, T - n:], w)  # (B, n): the last n positions survive
        self.k = _scatter(self.k, slots, k[:, T - n:], grad)
        self.v = None if v is None else _scatter(self.v, slots, v[:, T - n:], grad)
        self.lengths = torch.clamp(self.lengths + T, max=w)
        return keys, values, mask

    def clone(self) -> "RowKVCache":
        copy = lambda t: None if t is None else t.clone()  # noqa: E731
        return RowKVCache(copy(self.k), copy(self.v), self.lengths.clone(), self.window, self.span, self.fixed)


def _scatter(buffer: Tensor, slots: Tensor, new: Tensor, out_of_place: bool) -> Tensor:
    """`buffer` `(B, S, G, D)` with `new` `(B, T, G, D)` written at `slots` `(B, T)` of each row."""
    index = slots[:, :, None, None].expand(-1, -1, *buffer.shape[2:])  # (B, T, G, D)
    if out_of_place:
        return buffer.scatter(1, index, new)
    return buffer.scatter_(1, index, new)
