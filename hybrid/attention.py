"""Softmax attention, the mixer "A": rotary on any subset of q, k, v, o; GQA/MQA; sliding window; shared-KV.

Per head, with token positions `p_i = offset + i` and `R_p` the rotary rotation at `p` (or at the CARoPE
phase of token `p`):

    q_i ← R_i q_i  ("q")     k_j ← R_j k_j  ("k")     v_j ← R_j v_j  ("v")
    o_i = Σ_{j ∈ W(i)} softmax_j(scale · q_iᵀ k_j) v_j,      W(i) = {j : i − w < j ≤ i}   (w = ∞: global)
    o_i ← R_iᵀ o_i  ("o")    y_i = W_o o_i

"qk" and "vo" (and so "qkvo") are relative: `q_iᵀ R_{j−i} k_j`, `Σ_j a_ij R_{j−i} v_j`; a lone q, k, v, o or
"qkv" is absolute. Keys and values are rotated once, when inserted, so the cache holds `R_j k_j`, `R_j v_j`;
with `shared_kv` one projection `c_j` is key and value and the cache is the single tensor `R_j c_j`
(placement must rotate k and v alike: qkvo, qkv, q, o or none).

Softmax scale: `head_dim^-1/2`, times `attention_factor²` of the rotary scaling (YaRN / LongRoPE
temperature, 1 without scaling) when both q and k are rotated: the factor multiplies both rotated vectors in
those schemes, hence their logit; v and o rotations stay pure rotations.

`dynamic` / `longrope` scaling make the frequencies depend on the total length (see `Rotary`); keys cached
under earlier frequencies are not re-rotated (as in HF), so the modes agree only while the total length stays
at or below the schedule's `original_max_position_embeddings`.

Cache: without a window it grows (concatenation, `S = tokens seen`). With `window = w` it is a ring of `w`
slots, token `p` stored at slot `p % w`, allocated at its full size on the first write (in the dtype of the
keys), so `nbytes` is constant. Cache updates are out of place: a state passed in is never modified.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.checks import check_positive_int
from hybrid.rotary import CARoPE, Rotary, apply_rotary, cos_sin_from_phases, parse_placement

# enable_gqa (torch ≥ 2.5) lets SDPA broadcast kv heads without materialising them.
_SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


@dataclass
class AttentionState:
    """Decode state of one `Attention` layer.

    k: `(B, S, G, D)` rotated keys, or with shared-KV the one tensor `R_j c_j` (key and value); None
       before the first token. `S` = `length` without a window, `w` (ring slots) with one.
    v: `(B, S, G, D)` rotated values; None with shared-KV.
    offset: tokens seen (the position of the next token).
    length: tokens held in the cache (≤ w); they are positions `offset − length … offset − 1`. A state
       with `offset = c`, `length = 0` starts the sequence at position c.
    phase: `(B, G, P)` float32 CARoPE phase after the last token; None without CARoPE.
    buffer: the growable storage behind `k`, `v` of a global cache when decoding without gradients
       (`k`, `v` are then views of its first `length` slots); None otherwise. Not counted in `nbytes`,
       which reports the cached entries; the buffer holds up to twice that while it grows.
    """

    k: Tensor | None = None
    v: Tensor | None = None
    offset: int = 0
    length: int = 0
    phase: Tensor | None = None
    buffer: "_KVBuffer | None" = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.phase) if t is not None)


class Attention(nn.Module):
    """Causal softmax attention with rotary placement, GQA/MQA, sliding window, shared-KV and CARoPE.

    `in_proj` stacks `[W_q; W_k; W_v]` (rows `H·D`, `G·D`, `G·D`; with shared-KV `[W_q; W_c]`), `out_proj`
    maps `H·D → d_model`. H = n_heads, G = n_kv_heads (query head h reads kv head `h // (H/G)`),
    D = head_dim, R = rotary_dim, P = R/2.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        placement="qkvo",
        rope_base: float = 10000.0,
        rope_scaling=None,
        rope_layout: str = "interleaved",
        rotary_dim: int | None = None,
        window: int | None = None,
        shared_kv: bool = False,
        carope: bool = False,
        bias: bool = False,
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        check_positive_int("n_kv_heads", n_kv_heads, allow_none=True)
        check_positive_int("head_dim", head_dim, allow_none=True)
        check_positive_int("window", window, allow_none=True)
        check_positive_int("rotary_dim", rotary_dim, allow_none=True)
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"n_heads: expected a divisor of d_model={d_model} (or pass head_dim), got {n_heads}")
        head_dim = d_model // n_heads if head_dim is None else head_dim
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads={n_heads}, got {n_kv_heads}")
        pl = parse_placement(placement)
        rotates = pl.q or pl.k or pl.v or pl.o
        if rotates:
            if rotary_dim is None and head_dim % 2:
                raise ValueError(
                    f"head_dim: expected an even head_dim with rotary placement {pl.name!r} "
                    f"(or an even rotary_dim), got {head_dim}"
                )
            if rotary_dim is not None and (rotary_dim % 2 or rotary_dim > head_dim):
                raise ValueError(f"rotary_dim: expected an even int ≤ head_dim={head_dim}, got {rotary_dim}")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if isinstance(rope_base, bool) or not isinstance(rope_base, (int, float)) or not 1 < rope_base < float("inf"):
            raise ValueError(f"rope_base: expected a finite number > 1, got {rope_base!r}")
        if rope_layout not in ("interleaved", "half"):
            raise ValueError(f"rope_layout: expected 'interleaved' or 'half', got {rope_layout!r}")
        if shared_kv and pl.k != pl.v:
            raise ValueError(
                f"shared_kv: expected a placement rotating k and v alike (qkvo, qkv, q, o, none), "
                f"got placement {pl.name!r}"
            )
        if carope and not rotates:
            raise ValueError(f"carope: expected a placement that rotates something, got placement {pl.name!r}")
        if carope and rope_scaling is not None:
            raise ValueError(f"rope_scaling: expected None with carope=True, got {rope_scaling!r}")

        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.placement, self.rotary_dim, self.rope_layout = pl, rotary_dim, rope_layout
        self.window, self.shared_kv = window, shared_kv
        H, G, D = n_heads, n_kv_heads, head_dim
        self.in_proj = nn.Linear(d_model, (H + G * (1 if shared_kv else 2)) * D, bias=bias)
        self.out_proj = nn.Linear(H * D, d_model, bias=bias)
        self.rotary = None
        self.carope = None
        factor = 1.0
        if carope:
            self.carope = CARoPE(d_model, G, rotary_dim, rope_base)
        elif rotates:
            try:  # every other argument is checked above: what Rotary rejects is the scaling dict
                self.rotary = Rotary(D, base=rope_base, scaling=rope_scaling, layout=rope_layout, rotary_dim=rotary_dim)
            except ValueError as e:
                raise ValueError(f"rope_scaling: {e}") from e
            if pl.q and pl.k:
                factor = float(self.rotary.attention_factor)
        self.scale = D**-0.5 * factor**2

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}, placement={self.placement.name!r}, window={self.window}, "
            f"shared_kv={self.shared_kv}, carope={self.carope is not None}"
        )

    # ---------------------------------------------------------------------------------------------- API

    def init_state(self, batch_size: int, device=None) -> AttentionState:
        """An empty cache at position 0 (the kv tensors are allocated on the first token)."""
        phase = None
        if self.carope is not None:
            phase = torch.zeros(batch_size, self.n_kv_heads, self.rotary_dim // 2, device=device)  # (B, G, P)
        return AttentionState(phase=phase)

    def forward(self, x: Tensor, state: AttentionState | None = None) -> tuple[Tensor, AttentionState]:
        """x `(B, T, d_model)` → y `(B, T, d_model)` and the state after these T tokens (parallel / chunk)."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected (B, T, d_model={self.d_model}), got shape {tuple(x.shape)}")
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        if x.shape[1] == 0:
            return x.new_zeros(x.shape), state
        return self._attend(x, state)

    def step(self, x: Tensor, state: AttentionState | None) -> tuple[Tensor, AttentionState]:
        """x `(B, d_model)`: one token → y `(B, d_model)` and the next state (the recurrent form)."""
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected (B, d_model={self.d_model}), got shape {tuple(x.shape)}")
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        y, state = self._attend(x[:, None], state)  # (B, 1, d_model)
        return y[:, 0], state

    # ------------------------------------------------------------------------------------------ pieces

    def _attend(self, x: Tensor, state: AttentionState) -> tuple[Tensor, AttentionState]:
        B, T, _ = x.shape
        H, G, D, pl = self.n_heads, self.n_kv_heads, self.head_dim, self.placement
        qkv = self.in_proj(x)  # (B, T, (H + 2G)·D) or (B, T, (H + G)·D)
        q = qkv[..., : H * D].unflatten(-1, (H, D))  # (B, T, H, D)
        k = qkv[..., H * D : (H + G) * D].unflatten(-1, (G, D))  # (B, T, G, D)
        v = None if self.shared_kv else qkv[..., (H + G) * D :].unflatten(-1, (G, D))  # (B, T, G, D)

        cs_q, cs_kv, phase = self._cos_sin(x, state)
        if pl.q:
            q = self._rotate(q, cs_q)
        if pl.k:
            k = self._rotate(k, cs_kv)
        if v is not None and pl.v:
            v = self._rotate(v, cs_kv)

        o, ck, cv, length, buffer = self._mix(q, k, v, state)  # o (B, T, H, D)
        if pl.o:
            o = self._rotate(o, cs_q, inverse=True)
        y = self.out_proj(o.flatten(2))  # (B, T, H·D) → (B, T, d_model)
        return y, AttentionState(k=ck, v=cv, offset=state.offset + T, length=length, phase=phase, buffer=buffer)

    def _cos_sin(self, x: Tensor, state: AttentionState):
        """(cos, sin) for queries and for keys, and the next CARoPE phase.

        Rotary: both `(T, P)` at positions `offset + arange(T)`. CARoPE: keys `(B, T, G, P)` from the
        phases of x; queries `(B, T, H, P)`, each head taking its kv group's phases.
        """
        if self.carope is not None:
            phases, phase_end = self.carope(x, state.phase)  # (B, T, G, P), (B, G, P)
            cos, sin = cos_sin_from_phases(phases)  # (B, T, G, P) each
            rep = self.n_heads // self.n_kv_heads
            cs_q = (cos.repeat_interleave(rep, dim=2), sin.repeat_interleave(rep, dim=2))  # (B, T, H, P)
            return cs_q, (cos, sin), phase_end
        if self.rotary is None:
            return None, None, None
        cs = self.rotary.cos_sin(x.shape[1], offset=state.offset, device=x.device)  # (T, P) each
        return cs, cs, None

    def _rotate(self, t: Tensor, cs, inverse: bool = False) -> Tensor:
        return apply_rotary(
            t, cs[0], cs[1], inverse=inverse, layout=self.rope_layout, rotary_dim=self.rotary_dim
        )

    def _mix(self, q: Tensor, k: Tensor, v: Tensor | None, state: AttentionState):
        """Attend q `(B, T, H, D)` over the cache and the new k, v `(B, T, G, D)` (v None: shared-KV).

        Returns (o `(B, T, H, D)`, cache k, cache v, cached length, growable buffer or None).
        """
        T, w, off, L = q.shape[1], self.window, state.offset, state.length
        shared = v is None
        if state.k is not None:  # keep the cache's dtype
            if state.k.shape[0] != q.shape[0]:
                raise ValueError(f"state: expected a cache for batch size {q.shape[0]}, got {state.k.shape[0]}")
            k = k.to(state.k.dtype)
            v = None if shared else v.to(state.v.dtype)
        qpos = off + torch.arange(T, device=q.device)  # (T,)

        if w is None:  # growing cache, always in position order
            ck, cv, buffer = _append(state, k, v)  # (B, L + T, G, D)
            mask = None
            if L > 0 and T > 1:  # the prefix is all visible; causal among the new tokens
                kpos = off - L + torch.arange(L + T, device=q.device)  # (L + T,)
                mask = kpos[None, :] <= qpos[:, None]  # (T, L + T)
            o = self._sdpa(q, ck, ck if shared else cv, mask, is_causal=(L == 0 and T > 1))
            return o, ck, cv, L + T, buffer

        ring_k, ring_v = state.k, state.v
        if ring_k is None:
            B, _, G, D = k.shape
            ring_k = k.new_zeros(B, w, G, D)  # (B, w, G, D)
            ring_v = None if shared else v.new_zeros(B, w, G, D)
        length = min(L + T, w)
        if T == 1:  # decode: write first; the ring then holds exactly the window of the query
            ring_k, ring_v = _ring_write(ring_k, k, off + 1), _ring_write(ring_v, v, off + 1)
            mask = None
            if length < w:
                mask = (_ring_positions(off + 1, w, q.device) >= off + 1 - length)[None, :]  # (1, w)
            o = self._sdpa(q, ring_k, ring_k if shared else ring_v, mask, is_causal=False)
            return o, ring_k, ring_v, length, None

        # chunk: attend over the old ring (valid slots) and the new tokens, with the band mask
        if L == 0:
            keys, values, kpos = k, v, qpos
        else:
            keys = torch.cat([ring_k, k], dim=1)  # (B, w + T, G, D)
            values = None if shared else torch.cat([ring_v, v], dim=1)
            kpos = torch.cat([_ring_positions(off, w, q.device), qpos])  # (w + T,)
        mask = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] > qpos[:, None] - w)  # (T, S)
        if L > 0:
            mask[:, :w] &= kpos[None, :w] >= off - L  # slots never written (or from before the start)
        o = self._sdpa(q, keys, keys if shared else values, mask, is_causal=False)
        ring_k, ring_v = _ring_write(ring_k, k, off + T), _ring_write(ring_v, v, off + T)
        return o, ring_k, ring_v, length, None

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """q `(B, T, H, D)`, k, v `(B, S, G, D)`, mask bool `(T, S)` (True = attend) → `(B, T, H, D)`."""
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T|S, D)
        k, v = k.to(q.dtype), v.to(q.dtype)
        extra = {}
        if self.n_heads != self.n_kv_heads:
            if _SDPA_GQA and mask is None:  # flash / math kernels broadcast kv heads themselves
                extra["enable_gqa"] = True
            else:  # masked kernels (memory-efficient) do not: expand kv heads
                rep = self.n_heads // self.n_kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, S, D)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale, **extra)
        return o.transpose(1, 2)  # (B, T, H, D)


class _KVBuffer:
    """Growable storage of a global cache, shared by the states of one decoding stream.

    `filled` slots hold entries; a state whose `length` equals `filled` is the newest state on this buffer
    and may append in place. Older states keep views of a prefix that is never rewritten.
    """

    def __init__(self, k: Tensor, v: Tensor | None, filled: int):
        self.k, self.v, self.filled = k, v, filled

    def grow(self, needed: int) -> None:
        """Geometric growth to at least `needed` slots (copies the filled prefix once)."""
        if self.k.shape[1] >= needed:
            return
        capacity = max(2 * self.k.shape[1], needed)
        self.k = _with_capacity(self.k[:, : self.filled], capacity)
        self.v = None if self.v is None else _with_capacity(self.v[:, : self.filled], capacity)


def _with_capacity(t: Tensor, capacity: int) -> Tensor:
    """A `(B, capacity, G, D)` tensor starting with t `(B, n, G, D)`; the rest uninitialised."""
    out = t.new_empty(t.shape[0], capacity, *t.shape[2:])
    out[:, : t.shape[1]] = t
    return out


def _append(state: AttentionState, k: Tensor, v: Tensor | None):
    """The global cache after appending k, v `(B, T, G, D)`: (cache k, cache v, buffer or None).

    Without gradients, the newest state on a buffer appends in place (O(T) per call instead of copying
    the whole cache); any other state (an older one being branched from) copies its prefix into a fresh
    buffer. With gradients the cache is concatenated out of place, as autograd needs.
    """
    L, T = state.length, k.shape[1]
    shared = v is None
    if k.requires_grad or (state.k is not None and state.k.requires_grad):
        if L == 0:  # own the storage: k, v may be views into the fused projection
            return k.contiguous(), None if shared else v.contiguous(), None
        return torch.cat([state.k, k], dim=1), None if shared else torch.cat([state.v, v], dim=1), None
    buffer = state.buffer
    if buffer is None or buffer.filled != L:  # no buffer yet, or branching from an older state
        prefix_k = k[:, :0] if state.k is None else state.k[:, :L]
        prefix_v = None if shared else (v[:, :0] if state.v is None else state.v[:, :L])
        capacity = L + T if T > 1 and L == 0 else 2 * (L + T)  # a prefill is sized exactly
        buffer = _KVBuffer(_with_capacity(prefix_k, capacity),
                           None if shared else _with_capacity(prefix_v, capacity), L)
    buffer.grow(L + T)
    buffer.k[:, L : L + T] = k
    if not shared:
        buffer.v[:, L : L + T] = v
    buffer.filled = L + T
    return buffer.k[:, : L + T], None if shared else buffer.v[:, : L + T], buffer


def _ring_positions(end: int, w: int, device) -> Tensor:
    """Position held by each of the `w` ring slots once positions `< end` are written: slot s holds the
    largest `p < end` with `p ≡ s (mod w)`, i.e. `p = end − 1 − ((end − 1 − s) mod w)`. `(w,)` int64."""
    s = torch.arange(w, device=device)
    return end - 1 - torch.remainder(end - 1 - s, w)


def _ring_write(ring: Tensor | None, new: Tensor | None, end: int) -> Tensor | None:
    """Write new `(B, T, G, D)`, positions `end − T … end − 1`, into ring `(B, w, G, D)` (out of place)."""
    if ring is None:
        return None
    T, w = new.shape[1], ring.shape[1]
    n = min(T, w)  # only the last w tokens survive
    slots = torch.remainder(torch.arange(end - n, end, device=ring.device), w)  # (n,)
    return ring.index_copy(1, slots, new[:, T - n :].to(ring.dtype))

