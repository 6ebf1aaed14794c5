"""Softmax attention, the mixer "A": rotary on any subset of q, k, v, o; GQA/MQA; sliding window; shared-KV.

Per head, with token positions `p_i = offset + i` (`offset`: the caller's position of x's first token, 0 for a
fresh sequence; states hold no position) and `R_p` the rotary rotation at `p` (or at the CARoPE phase of token
`p`):

    q_i ← R_i q_i  ("q")     k_j ← R_j k_j  ("k")     v_j ← R_j v_j  ("v")
    o_i = Σ_{j ∈ W(i)} softmax_j(scale · q_iᵀ k_j) v_j,      W(i) = {j : i − w < j ≤ i}   (w = ∞: global)
    o_i ← R_iᵀ o_i  ("o")    y_i = W_o o_i

"qk" and "vo" (and so "qkvo") are relative: `q_iᵀ R_{j−i} k_j`, `Σ_j a_ij R_{j−i} v_j`; a lone q, k, v, o or
"qkv" is absolute. Keys and values are rotated once, when inserted, so the cache holds `R_j k_j`, `R_j v_j`;
with `shared_kv` one projection `c_j` is key and value and the cache is the single tensor `R_j c_j`
(placement must rotate k and v alike: qkvo, qkv, q, o or none).

scale = head_dim^{−1/2}, times attention_factor² of a YaRN / LongRoPE scaling when q and k are both rotated (as
Hugging Face scales cos and sin: with partial rotary, only the rotated channels' part of q·k gains it).
Why, the `dynamic` / `longrope` caveat and the caches: docs/design.md, "Attention (A)" and "KV caches and state
reuse".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hybrid.checks import check_bool, check_even_dim, check_input_dtype, check_positive_int
from hybrid.kernels.window_attention import BACKENDS as WINDOW_BACKENDS, sdpa_bthd, window_attention
from hybrid.attention_shard import attend_shard, check_attention_shard
from hybrid.kv_cache import KVCache, RingKVCache
from hybrid.mixer import Mixer, check_offset, check_shard_call
from hybrid.packed_attention import PackedAttention
from .attention_rows import attend_rows
from .attention_state import AttentionState, is_rows
from hybrid.rotary import PLACEMENTS, CARoPE, Rotary, RotaryConfig, apply_rotary, cos_sin_from_phases, parse_placement

# shared-KV caches one tensor as key and value, so k and v must be rotated alike
SHARED_KV_PLACEMENTS = tuple(p for p in PLACEMENTS if parse_placement(p).k == parse_placement(p).v)


@dataclass(frozen=True)
class AttentionConfig:
    """The options of an `Attention` layer, validated on construction; errors name the field.

    n_kv_heads: GQA / MQA key-value heads (a divisor of n_heads; None: n_heads). window: sliding window w
    (None: global). shared_kv: one projection is key and value (the cache holds one tensor). bias: biases
    on the q/k/v and output projections (imported Qwen2 / Llama checkpoints). placement: which of q, k, v, o
    are rotated (`hybrid.rotary.PLACEMENTS`). rotary_dim: partial rotary, the first R channels of each head
    (even, at most head_dim; None: head_dim).
    """

    n_kv_heads: int | None = None
    window: int | None = None
    shared_kv: bool = False
    bias: bool = False
    placement: str = "qkvo"
    rotary_dim: int | None = None

    def __post_init__(self):
        check_positive_int("n_kv_heads", self.n_kv_heads, allow_none=True)
        check_positive_int("window", self.window, allow_none=True)
        check_bool("shared_kv", self.shared_kv)
        check_bool("bias", self.bias)
        object.__setattr__(self, "placement", parse_placement(self.placement).name)  # "QK", "nope" → "qk", "none"
        check_positive_int("rotary_dim", self.rotary_dim, allow_none=True)
        if self.shared_kv and self.placement not in SHARED_KV_PLACEMENTS:
            raise ValueError(f"shared_kv: expected placement in {SHARED_KV_PLACEMENTS} (k and v rotated alike: "
                             f"one cached tensor is key and value), got placement={self.placement!r}")

    @property
    def state_grows(self) -> bool:
        """A global cache grows with the tokens seen; a window's ring does not."""
        return self.window is None

    @property
    def cheap_to_recompute(self) -> bool:
        """Windowed attention costs O(T·w); global attention O(T²)."""
        return self.window is not None

    def check_with(self, *, n_heads: int, head_dim: int, rotary: RotaryConfig) -> None:
        """The options fit `n_heads` heads of `head_dim` channels and the model's rotary options."""
        if self.n_kv_heads is not None and n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads={n_heads}, got {self.n_kv_heads}")
        if self.rotary_dim is not None:
            check_even_dim("rotary_dim", self.rotary_dim, at_most=head_dim)
        if not parse_placement(self.placement).any:
            if rotary.carope:
                raise ValueError(f"carope: expected placement to rotate something (else CARoPE's phases are "
                                 f"unused), got placement={self.placement!r}")
            return
        if self.rotary_dim is None:
            check_even_dim("head_dim", head_dim)  # or set an even rotary_dim
        rotary.check_with(self.rotary_dim or head_dim)


class Attention(PackedAttention, Mixer):
    """Causal softmax attention with rotary placement, GQA/MQA, sliding window, shared-KV and CARoPE.

    `in_proj` stacks `[W_q; W_k; W_v]` (rows `H·D`, `G·D`, `G·D`; with shared-KV `[W_q; W_c]`), `out_proj`
    maps `H·D → d_model`. H = n_heads, G = n_kv_heads (query head h reads kv head `h // (H/G)`),
    D = head_dim, R = rotary_dim, P = R/2. Options: `AttentionConfig` (`config=` or its fields as keywords);
    `rotary`: the model's `RotaryConfig` (CARoPE when `rotary.carope`). `window_backend` picks the way
    windowed calls attend (None or "auto": the fastest exact one for the device; see
    `hybrid.kernels.window_attention`).
    """

    Config, State = AttentionConfig, AttentionState

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 rotary: RotaryConfig | None = None, norm_eps: float = 1e-6, config: AttentionConfig | None = None,
                 window_backend: str | None = None, **options):
        super().__init__(d_model, n_heads, head_dim, rotary=rotary, norm_eps=norm_eps, config=config, **options)
        if window_backend not in (None, "auto", *WINDOW_BACKENDS):
            raise ValueError(
                f"window_backend: expected None, 'auto' or one of {WINDOW_BACKENDS}, got {window_backend!r}"
            )
        c, rot = self.config, self.rotary_config
        pl = parse_placement(c.placement)
        self.n_kv_heads = n_heads if c.n_kv_heads is None else c.n_kv_heads
        self.placement, self.rotary_dim, self.rope_layout = pl, c.rotary_dim or self.head_dim, rot.layout
        self.window, self.shared_kv = c.window, c.shared_kv
        self.window_backend = window_backend  # None: `window_attention`'s choice ("auto" / $HYBRID_WINDOW_BACKEND)
        H, G, D = n_heads, self.n_kv_heads, self.head_dim
        self.in_proj = nn.Linear(d_model, (H + G * (1 if c.shared_kv else 2)) * D, bias=c.bias)
        self.out_proj = nn.Linear(H * D, d_model, bias=c.bias)
        self.rotary = None
        self.carope = None
        factor = 1.0
        if pl.any and rot.carope:
            self.carope = CARoPE(d_model, G, self.rotary_dim, rot.base)
        elif pl.any:
            self.rotary = Rotary(D, base=rot.base, scaling=rot.scaling, layout=rot.layout, rotary_dim=self.rotary_dim)
            if pl.q and pl.k:
                factor = float(self.rotary.attention_factor)
        # HF multiplies the rotary cos and sin by the factor, so only the rotated channels' part of q·k gains
        # factor²: the whole logit when every channel rotates, else the queries' first R channels (rotate_qkv)
        whole = self.rotary_dim == D or factor == 1.0
        self.scale = D**-0.5 * (factor**2 if whole else 1.0)
        self.rotated_query_gain = 1.0 if whole else factor**2

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}, placement={self.placement.name!r}, window={self.window}, "
            f"shared_kv={self.shared_kv}, carope={self.carope is not None}"
        )

    # ---------------------------------------------------------------------------------------------- API

    def init_state(self, batch_size: int, device=None, dtype: torch.dtype | None = None) -> AttentionState:
        """An empty cache. The kv tensors are allocated on the first token, in the dtype of the
        keys (`dtype` is accepted for the common mixer signature; the CARoPE phase is float32 by design)."""
        phase = None
        if self.carope is not None:
            phase = torch.zeros(batch_size, self.n_kv_heads, self.rotary_dim // 2, device=device)  # (B, G, P)
        return AttentionState(phase=phase, batch=batch_size)

    def forward(self, x: Tensor, state=None, *, offset=0, cu_seqlens: Tensor | None = None,
                output_final_state: bool = True, shard=None):
        """x `(B, T, d_model)` at positions `offset … offset + T − 1` → y `(B, T, d_model)` and the state after
        these T tokens (parallel / chunk); the state is None when `output_final_state` is False (training: no
        cache is built). `offset`: the tokens `state` has seen (0 for a fresh sequence).

        `cu_seqlens` (`(N+1,)`, `hybrid.kernels.varlen`): x is a packed batch `(1, total_T, d_model)` of N
        sequences; no query sees another sequence's keys, and rotary positions restart at each sequence's
        offset. `state` is then None or a list of N `AttentionState | None` (batch 1 each), and so is the
        returned state; `offset` is 0 or a list of N positions.

        `offset` may be `(B,)` per-row positions (a ragged batch, `hybrid.attention_rows`): each row's rotary
        angles, cache slots and masks are its own; the state returned is in the rows form.

        `shard` (`hybrid.kernels.context_parallel.SequenceShard`): x is this rank's part of one long sequence; the
        keys and values before it come from the earlier ranks (`hybrid.attention_shard`). No state in or out.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected (B, T, d_model={self.d_model}), got shape {tuple(x.shape)}")
        check_input_dtype("x", x, self.out_proj.weight.dtype)
        if shard is not None:
            check_shard_call(shard, state, cu_seqlens, output_final_state)
            return attend_shard(self, x, shard), None
        if cu_seqlens is not None:
            return self._attend_packed(x, state, cu_seqlens, offset, output_final_state)
        if isinstance(offset, Tensor) or (state is not None and is_rows(state)):  # a ragged batch
            offset = self._row_offsets(offset, x)
            if x.shape[1] == 0:
                return x.new_zeros(x.shape), state
            y, state = attend_rows(self, x, state, offset)
            return y, (state if output_final_state else None)
        state, offset = self._continued(state, offset, x)
        if x.shape[1] == 0:
            return x.new_zeros(x.shape), (state if output_final_state else None)
        if not output_final_state and state.k is None:
            return self._attend_stateless(x, state, offset), None
        y, state = self._attend(x, state, offset)
        return y, (state if output_final_state else None)

    def check_shard(self) -> None:
        """The context-parallel path takes every option but a length-dependent rotary scaling."""
        check_attention_shard(self)

    def step(self, x: Tensor, state: AttentionState | None = None, offset: int = 0) -> tuple[Tensor, AttentionState]:
        """x `(B, d_model)`: one token at position `offset` (an int, or `(B,)` per-row positions) → y `(B, d_model)`
        and the next state (the recurrent form)."""
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected (B, d_model={self.d_model}), got shape {tuple(x.shape)}")
        check_input_dtype("x", x, self.out_proj.weight.dtype)
        if isinstance(offset, Tensor) or (state is not None and is_rows(state)):  # a ragged batch
            y, state = attend_rows(self, x[:, None], state, self._row_offsets(offset, x))
            return y[:, 0], state
        state, offset = self._continued(state, offset, x)
        y, state = self._attend(x[:, None], state, offset)  # (B, 1, d_model)
        return y[:, 0], state

    @staticmethod
    def _row_offsets(offset, x: Tensor) -> Tensor:
        """Per-row positions `(B,)`: the tensor given, or an int repeated for every row."""
        if isinstance(offset, Tensor):
            return check_offset(offset, batch=x.shape[0]).to(x.device)
        return torch.full((x.shape[0],), check_offset(offset), dtype=torch.long, device=x.device)

    def _continued(self, state: AttentionState | None, offset, x: Tensor) -> tuple[AttentionState, int]:
        """The state to continue (a fresh one for None) and the checked position: at least the tokens it holds."""
        offset = check_offset(offset)
        if state is None:
            return self.init_state(x.shape[0], x.device), offset
        if offset < state.length:
            raise ValueError(f"offset: expected the position of x's first token, at least the {state.length} tokens "
                             f"the state holds, got {offset}")
        return state, offset

    # ------------------------------------------------------------------------------------------ pieces

    def _attend(self, x: Tensor, state: AttentionState, offset: int) -> tuple[Tensor, AttentionState]:
        q, k, v = self.project(x)
        cs_q, cs_kv, phase = self.cos_sin(x, state, offset)
        q, k, v = self.rotate_qkv(q, k, v, cs_q, cs_kv)
        o, cache, length = self._mix(q, k, v, state, offset)  # o (B, T, H, D)
        y = self._finish(o, cs_q)
        if isinstance(cache, KVCache):
            ck, cv = cache.keys, cache.values  # (B, L + T, G, D)
        else:
            ck, cv = cache.k, cache.v  # (B, w, G, D)
        return y, AttentionState(k=ck, v=cv, length=length, phase=phase, cache=cache)

    def project(self, x: Tensor):
        """x `(B, T, d_model)` → q `(B, T, H, D)`, k `(B, T, G, D)`, v `(B, T, G, D)` (None with shared-KV),
        unrotated. With `cos_sin` and `rotate_qkv`: the queries and keys the layer scores (read by
        `hybrid.train.distill.mapping`)."""
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.in_proj(x)  # (B, T, (H + 2G)·D) or (B, T, (H + G)·D)
        q = qkv[..., : H * D].unflatten(-1, (H, D))  # (B, T, H, D)
        k = qkv[..., H * D : (H + G) * D].unflatten(-1, (G, D))  # (B, T, G, D)
        v = None if self.shared_kv else qkv[..., (H + G) * D :].unflatten(-1, (G, D))  # (B, T, G, D)
        return q, k, v

    def rotate_qkv(self, q: Tensor, k: Tensor, v: Tensor | None, cs_q, cs_kv):
        """q, k, v rotated where the placement says (its q, k, v flags): q by `cs_q`, k and v by `cs_kv`, the
        tables of `cos_sin`. Returns (q, k, v) in the shapes given."""
        pl = self.placement
        if pl.q:
            q = self._rotate(q, cs_q)
        if self.rotated_query_gain != 1.0:  # a YaRN / LongRoPE factor with partial rotary (__init__)
            R = self.rotary_dim
            q = torch.cat([q[..., :R] * self.rotated_query_gain, q[..., R:]], dim=-1)  # (B, T, H, D)
        if pl.k:
            k = self._rotate(k, cs_kv)
        if v is not None and pl.v:
            v = self._rotate(v, cs_kv)
        return q, k, v

    def _finish(self, o: Tensor, cs_q) -> Tensor:
        """Rotate o back (placement "o") and project: `(B, T, H, D)` → `(B, T, d_model)`."""
        if self.placement.o:
            o = self._rotate(o, cs_q, inverse=True)
        return self.out_proj(o.flatten(2))  # (B, T, H·D) → (B, T, d_model)

    def _attend_stateless(self, x: Tensor, state: AttentionState, offset: int) -> Tensor:
        """The training path: attention over the call's own tokens only, no cache built."""
        q, k, v = self.project(x)
        cs_q, cs_kv, _ = self.cos_sin(x, state, offset)
        q, k, v = self.rotate_qkv(q, k, v, cs_q, cs_kv)
        o = window_attention(q, k, k if v is None else v, self.window, scale=self.scale, backend=self.window_backend)
        return self._finish(o, cs_q)

    def cos_sin(self, x: Tensor, state: AttentionState, offset: int = 0):
        """(cos, sin) for queries and for keys, and the next CARoPE phase (from the state's), for x
        `(B, T, d_model)` at positions `offset …`; `(None, None, None)` when the layer rotates nothing.

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
        cs = self.rotary.cos_sin(x.shape[1], offset=offset, device=x.device)  # (T, P) each
        return cs, cs, None

    def _rotate(self, t: Tensor, cs, inverse: bool = False) -> Tensor:
        return apply_rotary(
            t, cs[0], cs[1], inverse=inverse, layout=self.rope_layout, rotary_dim=self.rotary_dim
        )

    def _mix(self, q: Tensor, k: Tensor, v: Tensor | None, state: AttentionState, offset: int):
        """Attend q `(B, T, H, D)` at positions `offset …` over the cache and the new k, v `(B, T, G, D)` (v None:
        shared-KV).

        Returns (o `(B, T, H, D)`, the updated cache, the cached length).
        """
        T, w, off, L = q.shape[1], self.window, offset, state.length
        shared = v is None
        if state.k is not None:  # keep the cache's dtype
            if state.k.shape[0] != q.shape[0]:
                raise ValueError(f"state: expected a cache for batch size {q.shape[0]}, got {state.k.shape[0]}")
            k = k.to(state.k.dtype)
            v = None if shared else v.to(state.v.dtype)

        if w is None:  # growing cache, always in position order
            cache = self._global_cache(state, k, v).update(k, v)
            keys, values = cache.keys, cache.values  # (B, L + T, G, D): the prefix, then causal among the new
            o = window_attention(q, keys, keys if shared else values, None, scale=self.scale,
                                 backend=self.window_backend)
            return o, cache, L + T

        ring = self._ring_cache(state, k, offset)
        length = min(L + T, w)
        if T == 1:  # decode: write in place first; the ring then holds exactly the window of the query
            ring = ring.update(k, v)
            keys, values, mask = ring.k, ring.v, None  # (B, w, G, D)
            if length < w and (off + 1 - length) % w == 0:  # not full, held in slots 0 … length − 1: a view
                keys, values = keys[:, :length], None if shared else values[:, :length]  # (B, length, G, D)
            elif length < w:  # not full, wrapped around the end (a state started at an offset)
                mask = (ring.positions() >= off + 1 - length)[None, :]  # (1, w)
            o = sdpa_bthd(q, keys, keys if shared else values, mask, self.scale)
            return o, ring, length

        # chunk: the last w − 1 cached tokens (in position order) then the new ones, block-local in O(T·w)
        keys, values = k, v
        prefix = min(L, w - 1)
        if prefix > 0:
            old_k, old_v = ring.last(prefix)  # (B, prefix, G, D)
            keys = torch.cat([old_k, k], dim=1)  # (B, prefix + T, G, D)
            values = None if shared else torch.cat([old_v, v], dim=1)
        o = window_attention(q, keys, keys if shared else values, w, scale=self.scale, backend=self.window_backend)
        return o, ring.update(k, v), length

    def _global_cache(self, state: AttentionState, k: Tensor, v: Tensor | None) -> KVCache:
        """The cache to append to: the state's own when it is the newest state on it, else (no cache yet, or
        branching from an older state) a new one holding the state's prefix."""
        cache, L, T = state.cache, state.length, k.shape[1]
        if isinstance(cache, KVCache) and cache.filled == L:
            return cache
        prefix_k = k[:, :0] if state.k is None else state.k[:, :L]  # (B, L, G, D)
        prefix_v = None if v is None else (v[:, :0] if state.v is None else state.v[:, :L])
        if torch.is_grad_enabled() and (k.requires_grad or prefix_k.requires_grad):
            return KVCache(prefix_k, prefix_v, L)  # update concatenates out of place
        return KVCache.from_prefix(prefix_k, prefix_v, L + T if T > 1 and L == 0 else 2 * (L + T))

    def _ring_cache(self, state: AttentionState, k: Tensor, offset: int) -> RingKVCache:
        """The ring to continue from at position `offset`: a fresh one before the first token, else the state's,
        whose write position must be `offset` (an older state's window may be overwritten)."""
        if state.k is None:
            return RingKVCache.empty(k, self.window, self.shared_kv, end=offset)
        if state.cache is None:
            return RingKVCache(state.k, state.v, offset)
        if state.cache.end != offset:
            raise ValueError(
                f"state: expected the newest state of its window cache (at position {state.cache.end}), got one "
                f"at position {offset}; clone() a state (AttentionState or HybridState) before continuing it more "
                "than once, and pass the position it was left at as offset"
            )
        return state.cache
