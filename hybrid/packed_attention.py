"""Attention over a packed batch (``cu_seqlens``, docs/design.md "Packed sequences"): the path of ``Attention.forward``
for N sequences laid end to end in one row, each with its own positions, its own cache as a prefix of keys, and its
own state out. A mixin of ``hybrid.attention.Attention``, whose projections, rotary and caches it uses (``State``:
the layer's state class)."""
from __future__ import annotations

import torch
from torch import Tensor

from hybrid.checks import check_sequence_states
from hybrid.kernels.varlen import PackedOffsets, host_offsets, packed_offsets
from hybrid.kernels.window_attention import window_attention
from hybrid.mixer import check_packed_offset, offset_arguments
from hybrid.rotary import cos_sin_from_phases

from .attention_state import is_rows, to_uniform

__all__ = ["PackedAttention"]


class PackedAttention:
    """``_attend_packed``: ``Attention.forward`` on a packed batch."""

    def _attend_packed(self, x: Tensor, states, cu_seqlens: Tensor, offset, output_final_state: bool):
        """`forward` on a packed batch (see `forward`): per-sequence positions, prefixes and states."""
        T = x.shape[1]
        packed = packed_offsets(cu_seqlens, T, x.device, batch=x.shape[0])  # checked once, then trusted
        N = packed.num_sequences
        states = check_sequence_states(states, N, self._check_sequence_state)
        offsets = check_packed_offset(offset, N)  # None: every sequence at position 0 (no list of N under compile)
        if states is not None:  # a row of a ragged batch (rows form) continues here as a uniform state
            offsets = [0] * N if offsets is None else offsets
            states = [to_uniform(st, o) if st is not None and is_rows(st) else st for st, o in zip(states, offsets)]
            if not any(offsets) and all(st is None or st.k is None for st in states):
                states, offsets = None, None  # empty caches at position 0: fresh sequences
        q, k, v = self.project(x)
        cs_q = cs_kv = phase_end = None
        if self.carope is not None:
            phase0 = None
            if states is not None:
                P = self.rotary_dim // 2
                phase0 = torch.stack([x.new_zeros(self.n_kv_heads, P, dtype=torch.float32)
                                      if st is None or st.phase is None else st.phase[0] for st in states])  # (N, G, P)
            phases, phase_end = self.carope.forward_packed(x, packed.cu_seqlens, phase0)  # (1, T, G, P), (N, G, P)
            cos, sin = cos_sin_from_phases(phases)
            rep = self.n_heads // self.n_kv_heads
            cs_q, cs_kv = (cos.repeat_interleave(rep, dim=2), sin.repeat_interleave(rep, dim=2)), (cos, sin)
        elif self.rotary is not None:
            off_t, max_offset = offset_arguments(offsets, x.device)
            cs_q = cs_kv = self.rotary.cos_sin_packed(packed.cu_seqlens, T, off_t, max_offset, device=x.device)
        q, k, v = self.rotate_qkv(q, k, v, cs_q, cs_kv)
        keys, values, cu_k = k, v, None
        if states is not None and any(st is not None and st.length > 0 for st in states):
            keys, values, cu_k = self._with_prefixes(k, v, states, offsets, packed)
        o = window_attention(q, keys, keys if values is None else values, self.window, scale=self.scale,
                             backend=self.window_backend, cu_seqlens=packed, cu_seqlens_k=cu_k)
        y = self._finish(o, cs_q)
        if not output_final_state:
            return y, None
        bounds = host_offsets(packed)
        offsets = [0] * N if offsets is None else offsets
        out = []
        for n in range(N):
            st = None if states is None else states[n]
            if st is not None and offsets[n] < st.length:
                raise ValueError(f"offset: expected the position of sequence {n}'s first token, at least the "
                                 f"{st.length} tokens its state holds, got {offsets[n]}")
            st = self.init_state(1, x.device) if st is None else st
            k_n = k[:, bounds[n]:bounds[n + 1]]  # (1, T_n, G, D)
            v_n = None if v is None else v[:, bounds[n]:bounds[n + 1]]
            if st.k is not None:
                k_n = k_n.to(st.k.dtype)
                v_n = None if v_n is None else v_n.to(st.v.dtype)
            T_n = k_n.shape[1]
            if self.window is None:
                cache = self._global_cache(st, k_n, v_n).update(k_n, v_n)
                ck, cv, length = cache.keys, cache.values, st.length + T_n
            else:
                cache = self._ring_cache(st, k_n, offsets[n]).update(k_n, v_n)
                ck, cv, length = cache.k, cache.v, min(st.length + T_n, self.window)
            phase = None if phase_end is None else phase_end[n:n + 1]
            out.append(self.State(k=ck, v=cv, length=length, phase=phase, cache=cache))
        return y, out

    def _check_sequence_state(self, state) -> None:
        if not isinstance(state, self.State):
            raise ValueError(f"state: expected {self.State.__name__} entries, got {type(state).__name__}")

    def _with_prefixes(self, k: Tensor, v: Tensor | None, states, offsets: list[int], packed: PackedOffsets):
        """Each sequence's visible cached keys (all of them, or the last w − 1 with a window) put before its new
        keys: packed keys `(1, total_K, G, D)` (values likewise) and their offsets `cu_seqlens_k`."""
        bounds = host_offsets(packed)
        pieces_k, pieces_v, cu_k = [], [], [0]
        for n, st in enumerate(states):
            new_k = k[:, bounds[n]:bounds[n + 1]]  # (1, T_n, G, D)
            new_v = None if v is None else v[:, bounds[n]:bounds[n + 1]]
            if st is not None and st.length > 0:
                if self.window is None:
                    old_k = st.k[:, :st.length]  # (1, L_n, G, D)
                    old_v = None if v is None else st.v[:, :st.length]
                else:
                    old_k, old_v = self._ring_cache(st, new_k, offsets[n]).last(min(st.length, self.window - 1))
                pieces_k.append(old_k.to(new_k.dtype))
                if v is not None:
                    pieces_v.append(old_v.to(new_v.dtype))
                cu_k.append(cu_k[-1] + old_k.shape[1])
            else:
                cu_k.append(cu_k[-1])
            pieces_k.append(new_k)
            if v is not None:
                pieces_v.append(new_v)
            cu_k[-1] += new_k.shape[1]
        keys = torch.cat(pieces_k, dim=1)  # (1, total_K, G, D)
        values = None if v is None else torch.cat(pieces_v, dim=1)
        return keys, values, PackedOffsets.from_bounds(cu_k, device=k.device, dtype=packed.cu_seqlens.dtype)
