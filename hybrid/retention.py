"""RetNet multi-scale retention, the mixer "M" (the baseline).

Per head h (decay γ_h = 1 − 2^{−5−h}), with positions p_n = offset + n (`offset`: the caller's position of the
first token, 0 for a fresh sequence; the state holds none) and RoPE rotations R_p:

    q̃_n = R_{p_n} W_q x_n,   k̃_n = R_{p_n} W_k x_n / √D,   v_n = W_v x_n
    o_n = Σ_{m≤n} γ^{n−m} (q̃_n · k̃_m) v_m                    (q̃_n·k̃_m = q_nᵀ R_{m−n} k_m: relative)
    y_n = W_o( swish(W_g x_n) ⊙ groupnorm(o_n) ),   groupnorm = per-head RMS norm over D, no weight

The retention itself is the op `hybrid.kernels.retention`; this layer holds the projections, rotary,
norm and gate. Three forms give the same o:
- parallel: o = ((Q̃ K̃ᵀ) ⊙ Dec) V with Dec[n, m] = exp((n − m)·log γ) for m ≤ n, else 0
  (`retention_reference`: O(T²), the tests' ground truth).
- chunkwise: the parallel form inside tiles of `tile_size` tokens plus γ^{c+1} q̃_c S carried in,
  S' = γ^C S + Σ_m γ^{C−1−m} k̃_mᵀ v_m across tiles (`retention_chunkwise`, O(T·tile_size)).
  `forward` runs it for whole sequences, with or without an incoming state.
- recurrent: S_t = γ S_{t−1} + k̃_tᵀ v_t, o_t = q̃_t S_t (`retention_step`, used by `step`).
S is (B, H, D, D) float32 (float64 for float64 inputs); q, k, v and o are computed in that precision,
with autocast disabled around the retention.

No normalisation of Dec or of the scores. The reference implementation (torchscale) divides row n of Dec
by √(Σ_m Dec[n, m]) and the scores by max(|Σ_m scores[n, m]|, 1); each is a positive factor per
(token, head), and the group norm right after maps c·o_n to o_n for any c > 0 (exactly when eps = 0; with
eps > 0 the effective eps becomes eps/c²). They guard the fp16 range of the parallel form and differ
between forms (the recurrent one needs an extra running scale), so those forms agree only after the norm.
This module keeps the retention in float32 and drops them: the output changes only through rounding and
eps, and the parallel, chunkwise and recurrent o agree exactly. `tests/hybrid/test_retention.py` checks
the invariance (random positive factors, and torchscale's two normalisers).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.batch_state import TensorState
from hybrid.checks import check_even_dim, check_input_dtype, check_positive_int, check_sequence_states
from hybrid.kernels.context_parallel import retention_cp
from hybrid.kernels.retention import DEFAULT_TILE_SIZE, retention_chunkwise, retention_step
from hybrid.kernels.varlen import packed_offsets
from hybrid.mixer import FixedStateOptions, Mixer, check_offset, check_packed_offset, check_shard_call, offset_arguments
from hybrid.norms import head_rms_norm
from hybrid.rotary import Rotary, RotaryConfig, apply_rotary

__all__ = ["MultiScaleRetention", "RetentionConfig", "RetentionState", "retention_log_decay"]


@dataclass
class RetentionState(TensorState):
    """State of one `MultiScaleRetention` layer; it holds no position (the caller passes `offset`). Never written
    in place: its row operations (select, cat, put, fork, rewind) are `TensorState`'s.

    S: (B, H, D, D) float32, `Σ_m γ^{p−1−m} k̃_mᵀ v_m` over the tokens seen, p the position of the next one
       (row index: key channel).
    """

    S: Tensor


def retention_log_decay(n_heads: int, device=None, dtype: torch.dtype = torch.float32) -> Tensor:
    """log γ_h = log(1 − 2^{−5−h}), h = 0 … H−1, evaluated in float64 on ``device``: (H,). Built there, not copied
    from the host: a copy from pageable host memory is a host sync in every step, and a CUDA graph cannot hold
    it (both seen on an H200, 2026-11-28). MPS has no float64, so it is evaluated in float32 there."""
    wide = torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64
    h = torch.arange(n_heads, dtype=wide, device=device)
    return torch.log1p(-torch.exp2(-5.0 - h)).to(dtype)


@dataclass(frozen=True)
class RetentionConfig(FixedStateOptions):
    """The options of a `MultiScaleRetention` layer, validated on construction; errors name the field.

    tile_size: the tile length of the chunkwise form `forward` runs (same numbers for any value; time and
    memory O(T·tile_size)).
    """

    tile_size: int = DEFAULT_TILE_SIZE

    def __post_init__(self):
        check_positive_int("tile_size", self.tile_size)

    def check_with(self, *, n_heads: int, head_dim: int, rotary: RotaryConfig) -> None:
        """Heads of `head_dim` channels are rotary pairs (RoPE on q and k), and the rotary options fit them."""
        check_even_dim("head_dim", head_dim)
        rotary.check_with(head_dim)


class MultiScaleRetention(Mixer):
    """Multi-scale retention: q, k, v, g projections d_model → H·D, output projection H·D → d_model.

    Options: `RetentionConfig` (`config=` or its fields as keywords). Of the `rotary` options it uses `base`
    and `layout` (RoPE on q and k; no scaling, no CARoPE); `norm_eps` is the group norm's eps.
    """

    Config = RetentionConfig

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 rotary: RotaryConfig | None = None, norm_eps: float = 1e-6, config: RetentionConfig | None = None,
                 **options):
        super().__init__(d_model, n_heads, head_dim, rotary=rotary, norm_eps=norm_eps, config=config, **options)
        rot = self.rotary_config
        self.rope_base, self.rope_layout = float(rot.base), rot.layout
        self.tile_size = self.config.tile_size
        inner = self.n_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=False)
        self.k_proj = nn.Linear(d_model, inner, bias=False)
        self.v_proj = nn.Linear(d_model, inner, bias=False)
        self.g_proj = nn.Linear(d_model, inner, bias=False)
        self.out_proj = nn.Linear(inner, d_model, bias=False)
        self.rotary = Rotary(self.head_dim, base=self.rope_base, layout=self.rope_layout)
        self.reset_parameters()

    def init_weights(self, std: float, depth_std: float) -> None:
        """RetNet's published initialisation (`reset_parameters`), not the model's: the baseline stays the
        baseline."""
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """RetNet's init: Xavier-uniform, gain 2^−2.5 for q, k, v, g and 1 for the output projection."""
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.g_proj):
            nn.init.xavier_uniform_(lin.weight, gain=2**-2.5)
        nn.init.xavier_uniform_(self.out_proj.weight)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"rope_base={self.rope_base:g}, rope_layout={self.rope_layout!r}, tile_size={self.tile_size}")

    def init_state(self, batch_size: int, device=None, dtype: torch.dtype | None = None) -> RetentionState:
        """A zero state; S is float32 whatever `dtype` (accepted for the common mixer signature)."""
        H, D = self.n_heads, self.head_dim
        return RetentionState(S=torch.zeros(batch_size, H, D, D, device=device, dtype=torch.float32))

    # --- pieces -------------------------------------------------------------------------------------
    def _check_state(self, state: RetentionState, batch: int) -> None:
        want = (batch, self.n_heads, self.head_dim, self.head_dim)
        if not isinstance(state, RetentionState):
            raise ValueError(f"state: expected a RetentionState or None, got {type(state).__name__}")
        if tuple(state.S.shape) != want:
            raise ValueError(f"state: expected S of shape {want}, got {tuple(state.S.shape)}")

    def _qkv(self, x: Tensor, offset, cdt: torch.dtype, cos_sin=None):
        """x (B, T, d_model) -> q̃, k̃, v each (B, T, H, D) in `cdt`, rotated at positions offset + arange(T)
        (`offset` an int, or `(B,)` per-row positions), or by the given `cos_sin`, each `(T, D/2)` (a packed batch's
        per-sequence positions)."""
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D).to(cdt)  # (B, T, H, D)
        k = self.k_proj(x).view(B, T, H, D).to(cdt) * D**-0.5  # (B, T, H, D)
        v = self.v_proj(x).view(B, T, H, D).to(cdt)  # (B, T, H, D)
        if cos_sin is None and isinstance(offset, Tensor):
            cos_sin = self.rotary.cos_sin_rows(offset, T, device=x.device)  # (B, T, 1, D/2) each
        cos, sin = cos_sin if cos_sin is not None else self.rotary.cos_sin(T, offset=offset, device=x.device)
        q = apply_rotary(q, cos, sin, layout=self.rope_layout)
        k = apply_rotary(k, cos, sin, layout=self.rope_layout)
        return q, k, v

    def _output(self, x: Tensor, o: Tensor) -> Tensor:
        """x (B, T, d_model), o (B, T, H, D) -> y = W_o(swish(W_g x) ⊙ groupnorm(o)) (B, T, d_model)."""
        o = head_rms_norm(o, self.norm_eps).flatten(2).to(x.dtype)  # (B, T, H·D)
        return self.out_proj(F.silu(self.g_proj(x)) * o)

    # --- forms --------------------------------------------------------------------------------------
    def forward(self, x: Tensor, state=None, *, offset=0, cu_seqlens: Tensor | None = None,
                output_final_state: bool = True, shard=None):
        """x (B, T, d_model) at positions offset … offset + T − 1 -> y (B, T, d_model), state after the T tokens
        (None when `output_final_state` is False): the chunkwise form, continuing `state` when given (it is not
        modified). `offset`: the tokens `state` has seen (0 for a fresh sequence).

        `cu_seqlens` (`(N+1,)`, `hybrid.kernels.varlen`): x is a packed batch `(1, total_T, d_model)` of N
        sequences, each restarting its retention and its rotary positions; `state` is then None or a list of N
        `RetentionState | None` (batch 1 each), and so is the returned state; `offset` is 0 or a list of N
        positions. Without it, `offset` may be `(B,)` per-row positions (a ragged batch).

        `shard` (`hybrid.kernels.context_parallel.SequenceShard`): x is this rank's part of one long sequence, at
        the shard's positions; the state entering it comes from the earlier ranks (`retention_cp`). No state in or
        out.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model or x.shape[1] < 1:
            raise ValueError(f"x: expected shape (B, T>=1, {self.d_model}), got {tuple(x.shape)}")
        check_input_dtype("x", x, self.out_proj.weight.dtype)
        if shard is not None:
            check_shard_call(shard, state, cu_seqlens, output_final_state)
            return self._forward_shard(x, shard), None
        if cu_seqlens is not None:
            return self._forward_packed(x, state, cu_seqlens, offset, output_final_state)
        B, T, _ = x.shape
        offset = check_offset(offset, batch=B)
        cdt = torch.promote_types(x.dtype, torch.float32)
        S = None
        if state is not None:
            self._check_state(state, B)
            S = state.S.to(cdt)
        q, k, v = self._qkv(x, offset, cdt)
        log_decay = retention_log_decay(self.n_heads, x.device, cdt)
        with torch.autocast(x.device.type, enabled=False):  # keep the retention and S in cdt
            o, S = retention_chunkwise(q, k, v, log_decay, S, output_final_state=output_final_state,
                                       tile_size=self.tile_size, check_values=False)  # (B, T, H, D)
        y = self._output(x, o)
        return y, (RetentionState(S=S) if output_final_state else None)

    def check_shard(self) -> None:
        """Retention has a context-parallel path (`forward(x, shard=…)`) for every option."""

    def _forward_shard(self, x: Tensor, shard) -> Tensor:
        """`forward` on this rank's shard of one long sequence (see `forward`): y (B, L, d_model)."""
        cdt = torch.promote_types(x.dtype, torch.float32)
        q, k, v = self._qkv(x, 0, cdt, self.rotary.cos_sin_shard(shard, device=x.device))
        log_gamma = retention_log_decay(self.n_heads, x.device, cdt)
        with torch.autocast(x.device.type, enabled=False):  # keep the retention and S in cdt
            o, _ = retention_cp(q, k, v, log_gamma, shard=shard, tile_size=self.tile_size)
        return self._output(x, o)

    def _forward_packed(self, x: Tensor, states, cu_seqlens: Tensor, offset, output_final_state: bool):
        """`forward` on a packed batch: per-sequence states and positions (see `forward`)."""
        T = x.shape[1]
        packed = packed_offsets(cu_seqlens, T, x.device, batch=x.shape[0])  # checked once, then trusted
        N = packed.num_sequences
        cdt = torch.promote_types(x.dtype, torch.float32)
        S, offsets = None, check_packed_offset(offset, N)  # offsets None: every sequence at position 0
        states = check_sequence_states(states, N, lambda st: self._check_state(st, 1))
        if states is not None:
            zero = self.init_state(1, x.device).S
            S = torch.cat([(zero if st is None else st.S).to(cdt) for st in states])  # (N, H, D, D)
        off_t, max_offset = offset_arguments(offsets, x.device)
        cos_sin = self.rotary.cos_sin_packed(packed.cu_seqlens, T, off_t, max_offset, device=x.device)
        q, k, v = self._qkv(x, 0, cdt, cos_sin)
        log_decay = retention_log_decay(self.n_heads, x.device, cdt)
        with torch.autocast(x.device.type, enabled=False):  # keep the retention and S in cdt
            o, S = retention_chunkwise(q, k, v, log_decay, S, output_final_state=output_final_state,
                                       cu_seqlens=packed, tile_size=self.tile_size, check_values=False)
        y = self._output(x, o)
        if not output_final_state:
            return y, None
        return y, [RetentionState(S=S[n:n + 1]) for n in range(N)]

    def step(self, x: Tensor, state: RetentionState | None = None, offset=0) -> tuple[Tensor, RetentionState]:
        """x (B, d_model) at position `offset` (an int, or `(B,)` per-row positions) -> y (B, d_model); the
        recurrent form S_t = γ S_{t−1} + k̃_tᵀ v_t, o_t = q̃_t S_t."""
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, {self.d_model}), got {tuple(x.shape)}")
        check_input_dtype("x", x, self.out_proj.weight.dtype)
        B = x.shape[0]
        if state is None:
            state = self.init_state(B, x.device)
        self._check_state(state, B)
        cdt = torch.promote_types(x.dtype, torch.float32)
        q, k, v = self._qkv(x[:, None], check_offset(offset, batch=B), cdt)  # (B, 1, H, D) each
        q, k, v = q[:, 0], k[:, 0], v[:, 0]  # (B, H, D)
        log_decay = retention_log_decay(self.n_heads, x.device, cdt)  # (H,)
        with torch.autocast(x.device.type, enabled=False):  # keep the retention and S in cdt
            o, S = retention_step(q, k, v, log_decay, state.S.to(cdt), check_values=False)  # (B, H, D), (B, H, D, D)
        y = self._output(x[:, None], o[:, None])[:, 0]  # (B, d_model)
        return y, RetentionState(S=S)
