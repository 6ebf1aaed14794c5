"""The KV cache objects behind `AttentionState`: storage plus the bookkeeping that lets decoding write in place.

Each has one `update(k, v)` that stores new rotated keys/values `(B, T, G, D)` (v None with shared-KV) and
returns the cache to attend over. `update` writes in place when autograd records nothing (decoding, no-grad
prefill) and returns `self`; when the new entries or the storage require grad it returns a new cache built out
of place, since autograd cannot record a write into a tensor that an earlier call saved for backward.

- `KVCache` (global attention): a growable buffer holding positions in order, `filled` of them valid. Several
  states of one decoding stream share it; a state whose `length` equals `filled` is the newest and appends in
  place (amortised O(T) per call); an older state copies its prefix into a fresh buffer first, so branching
  from any earlier state stays valid (copy on write).
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
