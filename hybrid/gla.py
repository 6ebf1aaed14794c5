r"""The "G" mixer: VO-RoPE around gated linear attention, a key-addressed matrix state whose values turn.

    q, k  = silu(conv1d_causal([W_q x; W_k x]))     (a short depthwise conv, as GLA; q scaled by 1/√Dk)
    v     = W_v x
    o_t   = Σ_{j≤t} (Π_{j<s≤t} γ_s) (q_t · k_j) R_{Φ_j − Φ_t} v_j           (hybrid.kernels.vo_gla)
    S_t   = γ_t · (S_{t−1} turned by e^{−iθ_t} on the value pairs) + k_t ⊗ v_t,      o_t = q_t S_t
    y     = W_o( silu(W_g x) ⊙ rmsnorm_head(o) )         (output_norm=False: o itself)

The R mixer is the case ``a_ij = γ^{i−j}`` of VO-RoPE attention (one complex number per value pair, read with no
query); G is ``a_ij = γ^{i−j} · q_iᵀk_j``: a ``Dk × Dv`` state per head, written by keys and read by queries
(recall), with the seed's relative rotation on the value side. Options (`GLAConfig`):

- ``decay``: "static", a learnable γ_h per head (``log γ = −exp(ν)``, starting on RetNet's schedule
  ``1 − 2^{−5−h}``), or "selective", a gate per token and head, starting at the same schedule;
- ``gate``: the selective decay's gate. "logsigmoid", GLA's ``log γ_t = logsigmoid(w_h·x_t + b_h) / 16``, never
  reaches γ_t = 1. "hardsigmoid", R's hard gate (the state-tracking recipe's): ``log γ_t = c·r_t·log γ_h`` with
  ``r_t = hardsigmoid(w_h·x_t + b_h)`` ∈ [0, 1], c = 8 and a learnable γ_h per head, so a token can hold the state
  exactly (r_t = 0, γ_t = 1). ``hold_below`` (hardsigmoid only): 0 (off), or a gate value in (0, 1) below which
  r_t is 0, straight-through (the value 0, the gradient r_t's), in training and at inference;
- ``phase``: "static", the VO-RoPE frequencies ``hybrid.rotary.inv_freq`` per value pair; "learned", the same as a
  parameter; "data", ``θ_t = π·σ(W x_t + b)`` ∈ (0, π) per token and pair (``hybrid.rotary.DataPhase``; a token can
  flip a pair's sign), with ``phase_round`` / ``phase_round_at_inference`` as the R mixer's;
- ``rotary_dim``: the first rotary_dim/2 value pairs turn, the rest keep θ = 0 (static and learned phases);
- ``key_dim``, ``value_dim``: the per-head key and value sizes (default head_dim; value_dim even);
- ``conv_width``: the short conv on q and k (0: none); ``tile_size``: the op's chunk length;
- ``output_norm``: RMS-normalise each head's read-out before the gate (GLA's; default), or not (False): the norm
  divides a pair by the whole head's size, so pairs whose sums grow with length (an exactly held head) shrink the
  others' share.

The state is kept in the frame of the last token seen, so it holds no position: `offset` is accepted for the common
signature and unused, as the R mixer's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.kernels.context_parallel import vo_gla_cp
from hybrid.kernels.varlen import device_offsets, packed_offsets
from hybrid.kernels.vo_gla import DEFAULT_TILE_SIZE, vo_gla, vo_gla_step

from .batch_state import TensorState
from .checks import (check_bool, check_choice, check_even_dim, check_input_dtype, check_int, check_number,
                     check_positive_int, check_sequence_states)
from .computed_buffers import default_device, register_computed_buffer
from .conv import CausalConv1d
from .mixer import FixedStateOptions, Mixer, check_shard_call
from .norms import rms_norm
from .precision import at_least_float32
from .recurrence import SELECTIVE_C, gated_log_decay
from .rotary import DataPhase, RotaryConfig, check_phase_rounding, inv_freq

__all__ = ["GLAConfig", "GLAState", "VOGatedLinearAttention", "DECAYS", "GATES", "PHASES", "GATE_NORMALIZER"]

DECAYS = ("static", "selective")
GATES = ("logsigmoid", "hardsigmoid")  # the selective decay's gate: GLA's, or R's hard gate (can hold γ_t = 1)
PHASES = ("static", "learned", "data")
GATE_NORMALIZER = 16.0  # GLA's: log γ_t = logsigmoid(z) / 16, so a gate near 0.5 keeps γ near 0.96


@dataclass
class GLAState(TensorState):
    """State of one G layer: fixed size, whatever the number of tokens seen; no position. Never written in place:
    its row operations (nbytes, clone, cat, select, put, fork, rewind) are `TensorState`'s.

    conv: ``(B, W−1, 2·H·Dk)``, the last inputs of the short conv on q and k (activation dtype).
    S: ``(B, H, Dk, Dv)`` float32, ``Σ_j (Π γ) k_j ⊗ R_{Φ_j − Φ_t} v_j`` in the frame of the last token t seen.
    """

    conv: Tensor
    S: Tensor


@dataclass(frozen=True)
class GLAConfig(FixedStateOptions):
    """The options of a `VOGatedLinearAttention` layer, validated on construction; errors name the field (see the
    module docstring for each)."""

    decay: str = "selective"
    gate: str = "logsigmoid"
    hold_below: float = 0.0
    phase: str = "static"
    phase_round: int = 0
    phase_round_at_inference: bool = False
    rotary_dim: int | None = None
    key_dim: int | None = None
    value_dim: int | None = None
    conv_width: int = 4
    tile_size: int = DEFAULT_TILE_SIZE
    output_norm: bool = True

    def __post_init__(self):
        check_choice("decay", self.decay, DECAYS)
        check_choice("gate", self.gate, GATES)
        if self.gate != "logsigmoid" and self.decay != "selective":
            raise ValueError(f"gate: applies to decay='selective' only, got {self.gate!r} with decay={self.decay!r}")
        check_number("hold_below", self.hold_below, low=0.0, high=1.0, high_open=True)
        if self.hold_below and self.gate != "hardsigmoid":
            raise ValueError(f"hold_below: applies to gate='hardsigmoid' only, got {self.hold_below} with "
                             f"gate={self.gate!r}")
        check_choice("phase", self.phase, PHASES)
        check_phase_rounding("pi-sigmoid", self.phase_round, self.phase_round_at_inference)
        if self.phase_round and self.phase != "data":
            raise ValueError(f"phase_round: applies to phase='data' only, got {self.phase_round} with "
                             f"phase={self.phase!r}")
        check_positive_int("rotary_dim", self.rotary_dim, allow_none=True)
        if self.rotary_dim is not None and self.phase == "data":
            raise ValueError(f"rotary_dim: applies to the 'static' and 'learned' phases, got {self.rotary_dim} with "
                             f"phase='data'")
        check_positive_int("key_dim", self.key_dim, allow_none=True)
        if self.value_dim is not None:
            check_even_dim("value_dim", self.value_dim)
        check_int("conv_width", self.conv_width, low=0, what="0 (no conv) or a positive int")
        check_positive_int("tile_size", self.tile_size)
        check_bool("output_norm", self.output_norm)

    def dims(self, head_dim: int) -> tuple[int, int]:
        """(key size, value size) per head."""
        return self.key_dim or head_dim, self.value_dim or head_dim

    def check_with(self, *, n_heads: int, head_dim: int, rotary: RotaryConfig) -> None:
        """The value heads are rotary pairs, rotary_dim fits them, and the rotary options fit the turning pairs."""
        Dv = self.dims(head_dim)[1]
        check_even_dim("value_dim" if self.value_dim else "head_dim", Dv)
        if self.rotary_dim is not None:
            check_even_dim("rotary_dim", self.rotary_dim, at_most=Dv, at_most_name="the value size")
        rotary.check_with(self.rotary_dim or Dv)


class VOGatedLinearAttention(Mixer):
    """VO-RoPE gated linear attention. Input and output ``(B, T, d_model)``.

    Options: `GLAConfig` (``config=`` or its fields as keywords); ``rotary``: the model's `RotaryConfig` (the base
    and scaling of the static, learned and data angles); ``norm_eps``: the output norm's eps.
    """

    Config = GLAConfig
    float32_buffers = ("theta",)  # the angles stay float32 in a float16 / bfloat16 model

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 rotary: RotaryConfig | None = None, norm_eps: float = 1e-6, config: GLAConfig | None = None,
                 **options):
        super().__init__(d_model, n_heads, head_dim, rotary=rotary, norm_eps=norm_eps, config=config, **options)
        c, rot = self.config, self.rotary_config
        H = self.n_heads
        self.key_dim, self.value_dim = c.dims(self.head_dim)
        Dk, Dv = self.key_dim, self.value_dim
        P = Dv // 2
        self.decay, self.gate, self.hold_below = c.decay, c.gate, c.hold_below
        self.phase, self.tile_size = c.phase, c.tile_size
        self.q_proj = nn.Linear(d_model, H * Dk, bias=False)
        self.k_proj = nn.Linear(d_model, H * Dk, bias=False)
        self.v_proj = nn.Linear(d_model, H * Dv, bias=False)
        self.g_proj = nn.Linear(d_model, H * Dv, bias=False)
        self.out_proj = nn.Linear(H * Dv, d_model, bias=False)
        self.conv = CausalConv1d(2 * H * Dk, c.conv_width) if c.conv_width else None
        self.output_norm = c.output_norm
        if self.output_norm:
            self.norm_weight = nn.Parameter(torch.ones(Dv))  # the output norm's weight, shared by the heads
        # decays: plain Parameters (the model's Linear init leaves them on their schedule)
        if self.decay == "static" or self.gate == "hardsigmoid":
            self.decay_nu = nn.Parameter(torch.empty(H))  # log γ = −exp(ν): γ_h, scaled by c·r_t when hard-gated
        if self.decay == "selective":
            self.decay_weight = nn.Parameter(torch.empty(H, d_model))
            self.decay_bias = nn.Parameter(torch.empty(H))
        R = c.rotary_dim or Dv
        freqs, _ = inv_freq(R, base=rot.base, scaling=rot.scaling)  # (R/2,) on the host
        theta = torch.cat([freqs, freqs.new_zeros(P - R // 2)]).repeat(H, 1)  # (H, P): pairs past R/2 keep θ = 0
        self._schedule_theta = theta  # on the host: a learned θ's start (``reset_parameters``)
        if self.phase == "learned":
            self.theta = nn.Parameter(theta.to(default_device(), copy=True))
        else:
            register_computed_buffer(self, "theta", theta)
        self.data_phase = None
        if self.phase == "data":
            self.data_phase = DataPhase(d_model, theta, "pi-sigmoid", round_to=c.phase_round,
                                        round_at_inference=c.phase_round_at_inference)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Decays on RetNet's schedule γ_h = 1 − 2^{−5−h} at every token (selective: the gate's weight 0, and its
        bias where the gate gives that γ; the hard gate's bias 0, r = 1/2, and γ_h where c·r·log γ_h is there).
        The output norm's weight ones; a learned θ the rotary schedule."""
        if self.output_norm:
            self.norm_weight.fill_(1.0)
        if isinstance(self.theta, nn.Parameter):
            self.theta.copy_(self._schedule_theta)
        log_gamma = torch.log1p(-torch.exp2(-5.0 - torch.arange(self.n_heads, dtype=torch.float64)))  # (H,)
        if self.decay == "static":
            self.decay_nu.copy_(torch.log(-log_gamma))
            return
        self.decay_weight.zero_()
        if self.gate == "hardsigmoid":
            self.decay_bias.zero_()  # hardsigmoid(0) = 1/2
            self.decay_nu.copy_(torch.log(-log_gamma / (0.5 * SELECTIVE_C)))
        else:
            self.decay_bias.copy_(torch.logit(torch.exp(GATE_NORMALIZER * log_gamma)))  # logsigmoid(b)/16 = log γ

    def extra_repr(self) -> str:
        gate = f", gate={self.gate!r}" if self.gate != "logsigmoid" else ""
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, key_dim={self.key_dim}, "
                f"value_dim={self.value_dim}, decay={self.decay!r}{gate}, phase={self.phase!r}")

    def init_state(self, batch_size: int, device=None, dtype: torch.dtype | None = None) -> GLAState:
        """A zero state; S is float32 whatever ``dtype`` (the conv tail's dtype)."""
        dtype = dtype or self.v_proj.weight.dtype
        width = self.config.conv_width
        conv = torch.zeros(batch_size, max(width - 1, 0), 2 * self.n_heads * self.key_dim, device=device, dtype=dtype)
        S = torch.zeros(batch_size, self.n_heads, self.key_dim, self.value_dim, device=device, dtype=torch.float32)
        return GLAState(conv=conv, S=S)

    # ------------------------------------------------------------------------------------------ pieces

    def log_decay(self, x: Tensor) -> Tensor:
        """log γ: ``(H,)`` (static) or ``(B, T, H)`` from x ``(B, T, d_model)`` (selective); float32 at least."""
        if self.decay == "static":
            return -torch.exp(at_least_float32(self.decay_nu))
        x32 = at_least_float32(x)
        z = F.linear(x32, self.decay_weight.to(x32.dtype), self.decay_bias.to(x32.dtype))  # (B, T, H)
        if self.gate == "logsigmoid":
            return F.logsigmoid(z) / GATE_NORMALIZER
        log_gamma = -torch.exp(self.decay_nu.to(x32.dtype))  # (H,): γ_h
        return gated_log_decay(F.hardsigmoid(z), log_gamma, self.hold_below)  # (B, T, H)

    def angles(self, x: Tensor) -> Tensor:
        """θ: ``(H, P)`` (static, learned) or ``(B, T, H, P)`` from x (data); float32 at least."""
        if self.data_phase is not None:
            return self.data_phase.increments(x)
        return at_least_float32(self.theta)

    def _keys(self, x: Tensor, conv_state, cu_seqlens=None, output_final_state=True, step=False, shard=None):
        """q, k ``(B, T, H, Dk)`` after the short conv (q scaled by 1/√Dk), and the conv's new state. ``shard``: the
        conv reads the W − 1 inputs before this rank's shard (``causal_conv1d_cp``)."""
        qk = torch.cat([self.q_proj(x), self.k_proj(x)], dim=-1)  # (B, T, 2·H·Dk) or (B, 2·H·Dk)
        if self.conv is None:  # no conv: an empty tail, one row per sequence
            rows = qk.shape[0] if cu_seqlens is None else device_offsets(cu_seqlens).numel() - 1
            new = qk.new_zeros(rows, 0, qk.shape[-1])
        elif step:
            qk, new = self.conv.step(qk, conv_state)
        else:
            qk, new = self.conv(qk, conv_state, cu_seqlens=cu_seqlens, output_final_state=output_final_state,
                                shard=shard)
        qk = F.silu(qk).unflatten(-1, (2, self.n_heads, self.key_dim))  # (…, 2, H, Dk)
        return qk.select(-3, 0) * self.key_dim ** -0.5, qk.select(-3, 1), new

    def _output(self, x: Tensor, o: Tensor) -> Tensor:
        """x ``(…, d_model)``, o ``(…, H, Dv)`` -> ``W_o(silu(W_g x) ⊙ rmsnorm_head(o))`` ``(…, d_model)``."""
        if self.output_norm:
            o = rms_norm(o, self.norm_weight, self.norm_eps)
        o = o.flatten(-2).to(x.dtype)  # (…, H, Dv) -> (…, H·Dv)
        return self.out_proj(F.silu(self.g_proj(x)) * o)

    def _check_state(self, state: GLAState, batch: int) -> None:
        if not isinstance(state, GLAState):
            raise ValueError(f"state: expected a GLAState or None, got {type(state).__name__}")
        want = (batch, self.n_heads, self.key_dim, self.value_dim)
        if tuple(state.S.shape) != want:
            raise ValueError(f"state: expected S of shape {want}, got {tuple(state.S.shape)}")

    # ------------------------------------------------------------------------------------------ forms

    def forward(self, x: Tensor, state=None, *, offset=0, cu_seqlens: Tensor | None = None,
                output_final_state: bool = True, shard=None):
        """Parallel / chunk form. x ``(B, T, d_model)`` -> (y ``(B, T, d_model)``, new state or None), continuing
        ``state`` when given (it is not modified). ``offset`` is unused: the rotation is relative.

        ``cu_seqlens`` (``(N+1,)``, ``hybrid.kernels.varlen``): x is a packed batch ``(1, total_T, d_model)`` of N
        sequences, each restarting the conv and the state; ``state`` is then None or a list of N ``GLAState |
        None`` (batch 1 each), and so is the returned state.

        ``shard`` (``hybrid.kernels.context_parallel.SequenceShard``): x is this rank's part of one long sequence
        (``(1, L, d_model)`` when the shard packs documents); the conv reads its halo and the state its carry from
        the earlier ranks (``causal_conv1d_cp``, ``vo_gla_cp``). No state in or out.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model or x.shape[1] < 1:
            raise ValueError(f"x: expected shape (B, T>=1, {self.d_model}), got {tuple(x.shape)}")
        check_input_dtype("x", x, self.v_proj.weight.dtype)
        if shard is not None:
            check_shard_call(shard, state, cu_seqlens, output_final_state)
            return self._forward_shard(x, shard), None
        N = None
        if cu_seqlens is not None:
            cu_seqlens = packed_offsets(cu_seqlens, x.shape[1], x.device, batch=x.shape[0])  # checked once
            N = cu_seqlens.num_sequences
            conv0, S0 = self._stack_states(state, N, x)
        elif state is not None:
            self._check_state(state, x.shape[0])
            conv0, S0 = state.conv, state.S
        else:
            conv0, S0 = None, None
        cdt = torch.promote_types(x.dtype, torch.float32)
        q, k, conv_state = self._keys(x, conv0, cu_seqlens, output_final_state)
        v = self.v_proj(x).unflatten(-1, (self.n_heads, self.value_dim))  # (B, T, H, Dv)
        log_decay, theta = self.log_decay(x), self.angles(x)
        with torch.autocast(x.device.type, enabled=False):  # keep the op and S in cdt
            o, S = vo_gla(q.to(cdt), k.to(cdt), v.to(cdt), log_decay.to(cdt), theta.to(cdt),
                          None if S0 is None else S0.to(cdt), output_final_state=output_final_state,
                          cu_seqlens=cu_seqlens, tile_size=self.tile_size, check_values=False)
        y = self._output(x, o)
        if not output_final_state:
            return y, None
        if N is None:
            return y, GLAState(conv=conv_state, S=S)
        return y, [GLAState(conv=conv_state[n:n + 1], S=S[n:n + 1]) for n in range(N)]

    def check_shard(self) -> None:
        """Every option of the G layer has a context-parallel path (`forward(x, shard=…)`)."""

    def _forward_shard(self, x: Tensor, shard) -> Tensor:
        """``forward`` on this rank's shard of one long sequence (see ``forward``): y ``(B, L, d_model)``. The decay
        and the angles are per token (or static), so each rank computes its own."""
        cdt = torch.promote_types(x.dtype, torch.float32)
        q, k, _ = self._keys(x, None, output_final_state=False, shard=shard)
        v = self.v_proj(x).unflatten(-1, (self.n_heads, self.value_dim))  # (B, L, H, Dv)
        log_decay, theta = self.log_decay(x), self.angles(x)
        with torch.autocast(x.device.type, enabled=False):  # keep the op and S in cdt
            o, _ = vo_gla_cp(q.to(cdt), k.to(cdt), v.to(cdt), log_decay.to(cdt), theta.to(cdt), shard=shard,
                             tile_size=self.tile_size, check_values=False)
        return self._output(x, o)

    def _stack_states(self, states, N: int, x: Tensor):
        """Per-sequence states (None or a list of N ``GLAState | None``) as ``conv (N, W−1, C)``, ``S (N, H, Dk, Dv)``
        (both None when every one is None: zeros)."""
        states = check_sequence_states(states, N, lambda s: self._check_state(s, 1))
        if states is None:
            return None, None
        blank = self.init_state(1, x.device, x.dtype)
        full = [blank if s is None else s for s in states]
        return torch.cat([s.conv.to(x.dtype) for s in full]), torch.cat([s.S for s in full])

    def step(self, x: Tensor, state: GLAState | None = None, offset: int = 0) -> tuple[Tensor, GLAState]:
        """Recurrent form, one token. x ``(B, d_model)`` -> (y ``(B, d_model)``, new state); ``offset`` unused."""
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, {self.d_model}), got {tuple(x.shape)}")
        check_input_dtype("x", x, self.v_proj.weight.dtype)
        B = x.shape[0]
        if state is None:
            state = self.init_state(B, x.device, x.dtype)
        self._check_state(state, B)
        cdt = torch.promote_types(x.dtype, torch.float32)
        q, k, conv_state = self._keys(x, state.conv, step=True)  # (B, H, Dk) each
        v = self.v_proj(x).unflatten(-1, (self.n_heads, self.value_dim))  # (B, H, Dv)
        log_decay, theta = self.log_decay(x[:, None]), self.angles(x[:, None])
        if log_decay.dim() == 3:
            log_decay = log_decay[:, 0]  # (B, H)
        if theta.dim() == 4:
            theta = theta[:, 0]  # (B, H, P)
        with torch.autocast(x.device.type, enabled=False):
            o, S = vo_gla_step(q.to(cdt), k.to(cdt), v.to(cdt), log_decay.to(cdt), theta.to(cdt), state.S.to(cdt),
                               check_values=False)
        return self._output(x, o), GLAState(conv=conv_state, S=S)
