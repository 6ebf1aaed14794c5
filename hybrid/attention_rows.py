"""Attention over a ragged batch: every row at its own position (`offset` a `(B,)` tensor), one cache slot per row.

`Attention.forward` / `step` take this path when the caller passes per-row positions, or when the state is
already in the rows form (a `RowKVCache` behind it). Row b's queries sit at positions `offset[b] + t`; rotary
angles, the cache slots written (the length of a global cache, `p mod w` in a window's ring) and the masks are
all per row. The T tokens of a call are the same count for every row (decode: T = 1; speculative verification:
T = k + 1); prompts of different lengths enter as one packed forward (`cu_seqlens`) and join with `cat`.

The state and its row operations (cat at any positions, select, put, fork, rewind) are `hybrid.attention_state`'s.
"""
from __future__ import annotations

from torch import Tensor

from hybrid.kernels.window_attention import sdpa_bthd

from .attention_state import AttentionState, is_rows, to_rows
from .kv_cache import RingKVCache, RowKVCache
from .rotary import cos_sin_from_phases


def attend_rows(layer, x: Tensor, state, offset: Tensor):
    """x `(B, T, d_model)`, row b at positions `offset[b] …` → y `(B, T, d_model)` and the next state (rows form)."""
    B = x.shape[0]
    if state is None:
        state = layer.init_state(B, x.device)
    q, k, v = layer.project(x)
    cs_q, cs_kv, phase = _cos_sin(layer, x, state, offset)
    q, k, v = layer.rotate_qkv(q, k, v, cs_q, cs_kv)
    cache = _cache_of(layer, state, k, offset)
    keys, values, mask = cache.attend(k, v, offset)  # mask (B, T, S)
    o = sdpa_bthd(q, keys, keys if values is None else values, mask[:, None], layer.scale)  # (B, T, H, D)
    y = layer._finish(o, cs_q)
    return y, AttentionState(k=cache.keys, v=cache.values, length=cache.lengths, phase=phase, cache=cache)


def _cos_sin(layer, x: Tensor, state, offset: Tensor):
    """(cos, sin) of queries and keys at each row's positions, and the next CARoPE phase (see `Attention.cos_sin`)."""
    if layer.carope is not None:
        phases, phase_end = layer.carope(x, state.phase)  # (B, T, G, P), (B, G, P): the phase is per row already
        cos, sin = cos_sin_from_phases(phases)
        rep = layer.n_heads // layer.n_kv_heads
        return (cos.repeat_interleave(rep, dim=2), sin.repeat_interleave(rep, dim=2)), (cos, sin), phase_end
    if layer.rotary is None:
        return None, None, None
    cs = layer.rotary.cos_sin_rows(offset, x.shape[1], device=x.device)  # (B, T, 1, P) each
    return cs, cs, None


def _cache_of(layer, state, k: Tensor, offset: Tensor) -> RowKVCache:
    """The rows cache to continue: the state's own when it is the newest on it, a fresh one before the first token,
    or a copy of a uniform state's entries."""
    if is_rows(state):
        if state.length is not state.cache.lengths:
            raise ValueError("state: expected the newest state of its cache, got an older one (a later call wrote "
                             "its slots in place); clone() a state (AttentionState or HybridState) before "
                             "continuing it more than once")
        return state.cache
    if state.k is None:
        B, _, G, D = k.shape
        return RowKVCache.empty(B, G, D, layer.window, layer.shared_kv, k.dtype, k.device)
    if isinstance(state.cache, RingKVCache) and bool((offset != state.cache.end).any()):
        raise ValueError(f"state: expected the newest state of its window cache (at position {state.cache.end}), "
                         f"got one continued at positions {offset.tolist()}; clone() a state before continuing it "
                         "more than once")
    return to_rows(state, layer.window).cache
