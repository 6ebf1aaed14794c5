"""The "R" mixer: Griffin's recurrent block with the RG-LRU replaced by the VO-RoPE complex scan.

    gate  = gelu(W_g x)                                             (B, T, d_rnn)
    u     = conv1d_causal(W_v x)            (depthwise, width 4)    (B, T, d_rnn)
    v_t   = sqrt(1 − γ_t²) · (i_t ⊙ u_t)    (i_t = 1 unless selective)
    s_t   = γ_t e^{−iθ_t} s_{t−1} + v_t     per head and rotary pair (hybrid.kernels.complex_scan)
    y     = W_o (gate ⊙ s)

With static γ and θ the scan output is exactly VO-RoPE with exponential decay,
``o_i = Σ_{j≤i} γ^{i−j} R_{j−i} v_j`` (Su, "The second type of rotary position encoding", 2025). Options:

- decay γ: learnable per head-channel, ``log γ = −exp(ν)``, initialised uniformly on the LRU ring
  ``γ² ~ U[r_min², r_max²]``; ``selective=True`` makes it data-dependent as in the RG-LRU:
  ``log γ_t = c·r_t·log γ`` with the recurrence gate ``r_t = σ(u_t W_a + b_a)``, c = 8, and an input gate
  ``i_t = σ(u_t W_x + b_x)`` (both block-diagonal per head). ``selective_gate="hardsigmoid"`` takes
  ``r_t = clamp((u_t W_a + b_a)/6 + ½, 0, 1)`` instead, which reaches 0 exactly: such a token holds the state
  as it is (γ_t = 1, and its write ``sqrt(1 − γ_t²)`` is 0), as a state-tracking automaton needs;
- angles θ, by ``phase``: ``"static"``, the rotary schedule ``hybrid.rotary.inv_freq(head_dim, base, scaling)``
  per pair; ``"learned"``, the same as a parameter; ``"carope"``, CARoPE phase increments ``θ_t = f(x_t)^i``
  ∈ (0, 1]; ``"data"``, ``θ_t = π·σ(W x_t + b)`` per pair (``hybrid.rotary.DataPhase``), so that a token can
  flip a pair's sign (state tracking: parity, modular counting). ``phase_map="real-sign"`` makes each pair's
  transition real instead, ``γ_t·(1 − 2σ(W x_t + b))`` (Grazzi et al.'s negative eigenvalues); ``phase_init``
  and ``phase_round`` (straight-through rounding of the angles to multiples of 2π/n) are the data phase's;
- ``rotary_dim`` R (partial rotary, as attention's): the first R/2 pairs of each head take the rotary schedule of
  R channels (``inv_freq(R, base, scaling)``), the other pairs θ = 0: they hold what they keep without rotating it,
  so a value read back after d tokens looks the same at any d (with every pair rotating, a slow pair's angle θ·d
  at the read leaves the range the readout was trained on once d passes the training distances). VO-RoPE
  attention with the same ``rotary_dim`` is this scan's static-decay limit, as with full rotary;
- ``readout_norm``: the scan output is RMS-normalised per head before the output gate,
  ``y ← y / sqrt(mean_d y² + eps)``, so a state that fades keeps its direction (the scan stays linear).

The input normalisation ``sqrt(1 − γ²)`` keeps the state's variance near the input's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from hybrid.kernels import complex_scan, complex_scan_step
from hybrid.kernels.complex_scan import complex_scan_transition_step
from hybrid.kernels.context_parallel import complex_scan_cp
from hybrid.kernels.varlen import packed_offsets

from .checks import (check_bool, check_choice, check_even_dim, check_input_dtype, check_number, check_positive_int,
                     check_sequence_states)
from .computed_buffers import default_device, register_computed_buffer
from .batch_state import TensorState
from .conv import CausalConv1d
from .mixer import FixedStateOptions, Mixer, check_shard_call
from .precision import at_least_float32
from .rotary import PHASE_INITS, PHASE_MAPS, CARoPE, DataPhase, RotaryConfig, check_phase_rounding, inv_freq

SELECTIVE_GATES = {"sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid}  # the recurrence gate r_t
SELECTIVE_C = 8.0
MIN_WRITE_SQ = 1e-12  # 1 − γ² is floored here: sqrt's gradient is infinite at γ = 1 (a held token, r_t = 0)

PHASES = ("static", "learned", "carope", "data")


def write_norm(log_decay: torch.Tensor) -> torch.Tensor:
    """The write ``sqrt(1 − γ²)`` from ``log γ``: floored at ``sqrt(MIN_WRITE_SQ)`` (finite gradients near γ = 1), and
    exactly 0 where γ = 1 (a held token: the state is kept as it is; the floor's gradient there is 0 anyway)."""
    write_sq = -torch.expm1(2.0 * log_decay)
    return torch.where(write_sq > 0, torch.sqrt(write_sq.clamp_min(MIN_WRITE_SQ)), 0.0)


def gated_log_decay(r: torch.Tensor, log_decay: torch.Tensor, hold_below: float = 0.0) -> torch.Tensor:
    """The selective decay ``log γ_t = c·r_t·log γ`` (RG-LRU's c = ``SELECTIVE_C``) from a recurrence gate r_t in
    [0, 1] and the static ``log γ`` (broadcast against r). ``hold_below`` > 0 shuts the gates below it: their value
    0 (γ_t = 1, the state held exactly), their gradient r's (straight-through). The R and G mixers' hard gates."""
    if hold_below:
        r = r + (r.masked_fill(r < hold_below, 0.0) - r).detach()
    return SELECTIVE_C * r * log_decay


@dataclass
class RecurrenceState(TensorState):
    """State of one R layer: fixed size, whatever the number of tokens seen; it holds no position (the rotation is
    relative). Never written in place: its row operations (select, cat, put, fork, rewind) are `TensorState`'s.

    conv: ``(B, W−1, d_rnn)``, the last inputs of the causal conv (activation dtype).
    scan: ``(B, H, head_dim)`` float32, the complex state (pairs interleaved).
    """

    conv: torch.Tensor
    scan: torch.Tensor


@dataclass(frozen=True)
class RecurrenceConfig(FixedStateOptions):
    """The options of a `VORecurrence` layer, validated on construction; errors name the field.

    r_min, r_max: the LRU ring of the initial decays, 0 < r_min ≤ r_max < 1. selective: data-dependent decay
    (RG-LRU-like gates); selective_gate: its recurrence gate, "sigmoid" (RG-LRU) or "hardsigmoid" (can hold
    γ_t = 1). hold_below: 0 (off), or a gate value in (0, 1) below which r_t is 0 (straight-through: the token
    holds the state exactly, and the gradient is the gate's own), in training and at inference. phase: the
    rotation angles, one of `PHASES` — "static" (the rotary schedule), "learned" (the schedule as a parameter),
    "carope" (CARoPE increments), "data" (θ_t from x_t) — or None: "carope" when the rotary options say carope,
    else "static". phase_map: the "data" angle map (`hybrid.rotary.DataPhase`).
    phase_init: the "data" angles' start, "schedule" (the rotary schedule) or "steepest" (z = 0). phase_round:
    0, or n ≥ 2 to round the "data" angles to multiples of 2π/n with a straight-through gradient, in training (the
    trainer may switch it on late, `hybrid.rotary.set_phase_rounding`) and at inference only with
    phase_round_at_inference. readout_norm: RMS-normalise the scan output per head. rotary_dim: None (every pair
    rotates) or an even R <= head_dim: the first R/2 pairs rotate (the schedule of R channels), the others keep
    θ = 0 ("static"; with "learned" they start there and may learn to turn); these two phases only. conv_width:
    the causal depthwise conv's width.
    """

    r_min: float = 0.9
    r_max: float = 0.999
    selective: bool = False
    selective_gate: str = "sigmoid"
    hold_below: float = 0.0
    phase: str | None = None
    phase_map: str = "pi-sigmoid"
    phase_init: str = "schedule"
    phase_round: int = 0
    phase_round_at_inference: bool = False
    readout_norm: bool = False
    rotary_dim: int | None = None
    conv_width: int = 4

    def __post_init__(self):
        check_number("r_min", self.r_min)
        check_number("r_max", self.r_max)
        if not 0.0 < self.r_min <= self.r_max < 1.0:
            raise ValueError(f"r_min, r_max: expected 0 < r_min <= r_max < 1, got {self.r_min}, {self.r_max}")
        check_bool("selective", self.selective)
        check_choice("selective_gate", self.selective_gate, tuple(SELECTIVE_GATES))
        if self.selective_gate != "sigmoid" and not self.selective:
            raise ValueError(f"selective_gate: has no effect without selective=True, got {self.selective_gate!r}")
        check_number("hold_below", self.hold_below, low=0.0, high=1.0, high_open=True)
        if self.hold_below and not self.selective:
            raise ValueError(f"hold_below: has no effect without selective=True, got {self.hold_below}")
        check_choice("phase", self.phase, (*PHASES, None))
        check_choice("phase_map", self.phase_map, PHASE_MAPS)
        check_choice("phase_init", self.phase_init, PHASE_INITS)
        check_phase_rounding(self.phase_map, self.phase_round, self.phase_round_at_inference)
        data_only = {"phase_init": ("schedule", self.phase_init), "phase_round": (0, self.phase_round)}
        for name, (default, value) in data_only.items():
            if value != default and self.phase != "data":
                raise ValueError(f"{name}: applies to phase='data' only, got {value!r} with phase={self.phase!r}")
        if self.phase_init == "steepest" and self.phase_map == "real-sign":
            raise ValueError("phase_init: expected 'schedule' with phase_map='real-sign' (its steepest point is the "
                             "zero transition), got 'steepest'")
        check_bool("readout_norm", self.readout_norm)
        check_positive_int("rotary_dim", self.rotary_dim, allow_none=True)
        check_positive_int("conv_width", self.conv_width)

    def resolved_phase(self, rotary: RotaryConfig) -> str:
        """`phase`, or by default "carope" when `rotary.carope`, else "static"."""
        if self.phase is not None:
            return self.phase
        return "carope" if rotary.carope else "static"

    def check_with(self, *, n_heads: int, head_dim: int, rotary: RotaryConfig) -> None:
        """The options fit heads of `head_dim` channels (rotary pairs) and the model's rotary options."""
        check_even_dim("head_dim", head_dim)
        phase = self.resolved_phase(rotary)
        if self.rotary_dim is not None:
            check_even_dim("rotary_dim", self.rotary_dim, at_most=head_dim)
            if phase not in ("static", "learned"):
                raise ValueError(f"rotary_dim: applies to the 'static' and 'learned' phases, got {self.rotary_dim} "
                                 f"with phase={phase!r}")
        rotary.check_with(self.rotary_dim or head_dim)
        if phase == "carope" and rotary.scaling is not None:
            raise ValueError(f"phase: CARoPE has no context-extension scaling; expected scaling=None with "
                             f"phase='carope', got {rotary.scaling!r}")


class VORecurrence(Mixer):
    """VO-RoPE recurrence block. Input and output ``(B, T, d_model)``.

    Options: `RecurrenceConfig` (``config=`` or its fields as keywords); ``rotary``: the model's `RotaryConfig`
    (the schedule of the "static", "learned" and "data" angles; CARoPE's base).
    """

    Config = RecurrenceConfig
    float32_buffers = ("theta",)  # the angles stay float32 in a float16 / bfloat16 model

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 rotary: RotaryConfig | None = None, norm_eps: float = 1e-6, config: RecurrenceConfig | None = None,
                 **options):
        super().__init__(d_model, n_heads, head_dim, rotary=rotary, norm_eps=norm_eps, config=config, **options)
        c, rot = self.config, self.rotary_config
        self.n_pairs = self.head_dim // 2
        self.d_rnn = self.n_heads * self.head_dim
        self.r_min, self.r_max = c.r_min, c.r_max
        self.selective, self.selective_gate, self.phase = c.selective, c.selective_gate, c.resolved_phase(rot)
        self.hold_below = c.hold_below
        H, P, hd = self.n_heads, self.n_pairs, self.head_dim

        self.gate_proj = nn.Linear(d_model, self.d_rnn, bias=False)
        self.value_proj = nn.Linear(d_model, self.d_rnn, bias=False)
        self.conv = CausalConv1d(self.d_rnn, c.conv_width)
        self.out_proj = nn.Linear(self.d_rnn, d_model, bias=False)
        self.decay_nu = nn.Parameter(torch.empty(H, P))  # log γ = −exp(ν)
        if self.selective:
            self.recur_gate_weight = nn.Parameter(torch.empty(H, hd, P))  # block-diagonal u → r
            self.recur_gate_bias = nn.Parameter(torch.empty(H, P))
            self.input_gate_weight = nn.Parameter(torch.empty(H, hd, hd))  # block-diagonal u → i
            self.input_gate_bias = nn.Parameter(torch.empty(H, hd))
        R = c.rotary_dim or hd
        freqs, _ = inv_freq(R, base=rot.base, scaling=rot.scaling)  # (R/2,) on the host
        freqs = torch.cat([freqs, freqs.new_zeros(P - R // 2)])  # (P,): pairs past R/2 do not rotate
        theta = freqs.repeat(H, 1)  # (H, P): every head gets the rotary schedule
        self._schedule_theta = theta  # on the host: a learned θ's start (``reset_parameters``)
        if self.phase == "learned":
            self.theta = nn.Parameter(theta.to(default_device(), copy=True))
        else:
            register_computed_buffer(self, "theta", theta)
        self.carope = CARoPE(d_model, H, hd, base=rot.base) if self.phase == "carope" else None
        self.data_phase = None
        if self.phase == "data":
            self.data_phase = DataPhase(d_model, theta, c.phase_map, init=c.phase_init, round_to=c.phase_round,
                                        round_at_inference=c.phase_round_at_inference)
        self.readout_norm = c.readout_norm
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """LRU ring init for γ; gates start near the middle of their range."""
        u = torch.rand(self.n_heads, self.n_pairs)
        gamma_sq = self.r_min ** 2 + u * (self.r_max ** 2 - self.r_min ** 2)
        self.decay_nu.copy_(torch.log(-0.5 * torch.log(gamma_sq)))  # ν = log(−log γ)
        if isinstance(self.theta, nn.Parameter):  # phase "learned": the rotary schedule
            self.theta.copy_(self._schedule_theta)
        if self.selective:
            bound = 1.0 / math.sqrt(self.head_dim)
            for w in (self.recur_gate_weight, self.input_gate_weight):
                nn.init.uniform_(w, -bound, bound)
            self.recur_gate_bias.zero_()
            self.input_gate_bias.zero_()

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
            f"selective={self.selective}, phase={self.phase!r}"
            + (f", selective_gate={self.selective_gate!r}" if self.selective_gate != "sigmoid" else "")
        )

    # ------------------------------------------------------------------------------------------ pieces

    def log_decay(self) -> torch.Tensor:
        """Static ``log γ = −exp(ν)``, ``(H, P)`` float32, always < 0."""
        return -torch.exp(at_least_float32(self.decay_nu))

    def init_state(self, batch_size: int, device=None, dtype: torch.dtype | None = None) -> RecurrenceState:
        dtype = dtype or self.value_proj.weight.dtype
        conv = self.conv.init_state(batch_size, device=device, dtype=dtype)
        scan = torch.zeros(batch_size, self.n_heads, self.head_dim, device=device, dtype=torch.float32)
        return RecurrenceState(conv=conv, scan=scan)

    def scan_inputs(self, x: torch.Tensor, u: torch.Tensor):
        """Scan inputs from the mixer input x ``(B, T, d_model)`` and the conv output u ``(B, T, d_rnn)``.

        Returns v ``(B, T, H, hd)`` in u's dtype, log γ and θ, each ``(H, P)`` or ``(B, T, H, P)`` float32.
        """
        uh = rearrange(at_least_float32(u), "b t (h d) -> b t h d", h=self.n_heads)
        log_decay = self.log_decay()  # (H, P)
        if self.selective:
            w_r, b_r, w_i, b_i = (
                p.to(uh.dtype)
                for p in (self.recur_gate_weight, self.recur_gate_bias, self.input_gate_weight, self.input_gate_bias)
            )
            r = SELECTIVE_GATES[self.selective_gate](torch.einsum("bthi,hip->bthp", uh, w_r) + b_r)  # (B, T, H, P)
            i = torch.sigmoid(torch.einsum("bthi,hij->bthj", uh, w_i) + b_i)  # input gate (B, T, H, hd)
            log_decay = gated_log_decay(r, log_decay, self.hold_below)  # (B, T, H, P)
            uh = uh * i
        if self.carope is not None:
            theta = self.carope.increments(x)  # (B, T, H, P)
        elif self.data_phase is not None:
            theta, log_factor = self.data_phase.transition(x)  # (B, T, H, P) each; a factor for "real-sign"
            if log_factor is not None:
                log_decay = log_decay + log_factor.to(log_decay.dtype)  # |γ_t (1 − 2σ(z_t))|, (B, T, H, P)
        else:
            theta = at_least_float32(self.theta)  # (H, P)
        norm = write_norm(log_decay)  # sqrt(1 − γ²), (…, H, P)
        pairs = rearrange(uh, "b t h (p two) -> b t h p two", two=2)
        v = rearrange(pairs * norm.unsqueeze(-1), "b t h p two -> b t h (p two)")  # both parts of each pair
        return v.to(u.dtype), log_decay, theta

    def readout(self, y: torch.Tensor) -> torch.Tensor:
        """The scan output ``(…, H, hd)`` as the gate sees it: RMS-normalised per head with ``readout_norm``."""
        if not self.readout_norm:
            return y
        y32 = at_least_float32(y)
        return (y32 * torch.rsqrt(y32.square().mean(-1, keepdim=True) + self.norm_eps)).to(y.dtype)

    def _check_state(self, state: RecurrenceState, batch: int) -> None:
        if not isinstance(state, RecurrenceState):
            raise ValueError(f"state: expected a RecurrenceState or None, got {type(state).__name__}")
        want = (batch, self.n_heads, self.head_dim)
        if tuple(state.scan.shape) != want:
            raise ValueError(f"state: expected a scan state of shape {want}, got {tuple(state.scan.shape)}")

    # ------------------------------------------------------------------------------------------ forms

    def forward(self, x: torch.Tensor, state=None, *, offset=0, cu_seqlens: torch.Tensor | None = None,
                output_final_state: bool = True, shard=None):
        """Parallel / chunk form. x ``(B, T, d_model)`` -> (y ``(B, T, d_model)``, new state or None).

        ``offset`` (the position of x's first token) is accepted for the common mixer signature and unused: the
        rotation is relative by construction, so the output does not depend on where the sequence starts.

        ``cu_seqlens`` (``(N+1,)``, ``hybrid.kernels.varlen``): x is a packed batch ``(1, total_T, d_model)`` of N
        sequences, each restarting the conv and the scan; ``state`` is then None or a list of N
        ``RecurrenceState | None`` (one per sequence, batch 1), and so is the returned state.
        ``output_final_state=False`` builds no state (training) and returns None for it.

        ``shard`` (``hybrid.kernels.context_parallel.SequenceShard``): x is this rank's part of one long sequence
        (``(1, L, d_model)`` when the shard packs documents); the conv reads its halo and the scan its carry from
        the earlier ranks (``causal_conv1d_cp``, ``complex_scan_cp``). No state in or out.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        check_input_dtype("x", x, self.value_proj.weight.dtype)
        if shard is not None:
            check_shard_call(shard, state, cu_seqlens, output_final_state)
            return self._forward_shard(x, shard), None
        if cu_seqlens is not None:
            return self._forward_packed(x, state, cu_seqlens, output_final_state)
        if state is not None:
            self._check_state(state, x.shape[0])
        conv0, scan0 = (None, None) if state is None else (state.conv, state.scan)
        gate = F.gelu(self.gate_proj(x))
        u, conv_state = self.conv(self.value_proj(x), conv0, output_final_state=output_final_state)
        v, log_decay, theta = self.scan_inputs(x, u)
        y, scan_state = complex_scan(
            v, log_decay, theta, scan0, output_final_state=output_final_state, check_values=False,
        )
        y = rearrange(self.readout(y), "b t h d -> b t (h d)").to(gate.dtype)
        out = self.out_proj(gate * y)
        if not output_final_state:
            return out, None
        return out, RecurrenceState(conv=conv_state, scan=scan_state)

    def check_shard(self) -> None:
        """Every option of the R layer has a context-parallel path (`forward(x, shard=…)`)."""

    def _forward_shard(self, x: torch.Tensor, shard) -> torch.Tensor:
        """``forward`` on this rank's shard of one long sequence (see ``forward``): y ``(B, L, d_model)``."""
        gate = F.gelu(self.gate_proj(x))
        u, _ = self.conv(self.value_proj(x), output_final_state=False, shard=shard)
        v, log_decay, theta = self.scan_inputs(x, u)
        y, _ = complex_scan_cp(v, log_decay, theta, shard=shard, check_values=False)
        return self.out_proj(gate * rearrange(self.readout(y), "b t h d -> b t (h d)").to(gate.dtype))

    def _forward_packed(self, x: torch.Tensor, states, cu_seqlens: torch.Tensor, output_final_state: bool):
        """``forward`` on a packed batch: per-sequence states in and out (see ``forward``)."""
        packed = packed_offsets(cu_seqlens, x.shape[1], x.device, batch=x.shape[0])  # checked once, then trusted
        N = packed.num_sequences
        conv0, scan0 = self._stack_states(states, N, x)
        gate = F.gelu(self.gate_proj(x))
        u, conv_state = self.conv(self.value_proj(x), conv0, cu_seqlens=packed,
                                  output_final_state=output_final_state)
        v, log_decay, theta = self.scan_inputs(x, u)
        y, scan_state = complex_scan(
            v, log_decay, theta, scan0, output_final_state=output_final_state, cu_seqlens=packed,
            check_values=False,
        )
        out = self.out_proj(gate * rearrange(self.readout(y), "b t h d -> b t (h d)").to(gate.dtype))
        if not output_final_state:
            return out, None
        return out, [RecurrenceState(conv=conv_state[n:n + 1], scan=scan_state[n:n + 1]) for n in range(N)]

    def _stack_states(self, states, N: int, x: torch.Tensor):
        """Per-sequence states (None or a list of N ``RecurrenceState | None``) as ``conv (N, W−1, C)``, ``scan
        (N, H, D)`` (both None when every one is None: zeros)."""
        states = check_sequence_states(states, N, lambda s: self._check_state(s, 1))
        if states is None:
            return None, None
        blank = self.init_state(1, x.device, x.dtype)
        full = [blank if s is None else s for s in states]
        conv = torch.cat([s.conv.to(x.dtype) for s in full])  # (N, W−1, C)
        scan = torch.cat([s.scan for s in full])  # (N, H, D)
        return conv, scan

    def step(self, x: torch.Tensor, state: RecurrenceState | None = None, offset: int = 0):
        """Recurrent form, one token. x ``(B, d_model)`` -> (y ``(B, d_model)``, new state); ``offset`` (an int or
        per-row positions ``(B,)``) unused (see ``forward``)."""
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, d_model={self.d_model}), got {tuple(x.shape)}")
        check_input_dtype("x", x, self.value_proj.weight.dtype)
        B = x.shape[0]
        if state is None:
            state = self.init_state(B, x.device, x.dtype)
        self._check_state(state, B)
        gate = F.gelu(self.gate_proj(x))
        u, conv_state = self.conv.step(self.value_proj(x), state.conv)
        if self._token_free_transition() and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            norm, transition = self._step_constants()  # (H, P) each
            pairs = at_least_float32(u).reshape(B, self.n_heads, self.n_pairs, 2)  # (B, H, P, 2)
            v = (pairs * norm.unsqueeze(-1)).reshape(B, self.n_heads, self.head_dim).to(u.dtype)  # as scan_inputs
            y, scan_state = complex_scan_transition_step(v, transition, state.scan)
        else:
            v, log_decay, theta = self.scan_inputs(x.unsqueeze(1), u.unsqueeze(1))  # as a length-1 sequence
            if log_decay.dim() == 4:
                log_decay = log_decay[:, 0]
            if theta.dim() == 4:
                theta = theta[:, 0]
            y, scan_state = complex_scan_step(v[:, 0], log_decay, theta, state.scan, check_values=False)
        out = self.out_proj(gate * self.readout(y).reshape(B, self.d_rnn).to(gate.dtype))
        return out, RecurrenceState(conv=conv_state, scan=scan_state)

    def _token_free_transition(self) -> bool:
        """γ and θ are parameters (or buffers) only: no selective gate, CARoPE or data-dependent angle."""
        return not self.selective and self.carope is None and self.data_phase is None

    def _step_constants(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The write norm sqrt(1 − γ²) and the transition γ e^{−iθ} (complex), each ``(H, P)``, of a layer whose γ and θ
        depend on no token, computed as ``scan_inputs`` and ``complex_scan_step`` compute them and kept until
        ``decay_nu`` or ``theta`` changes (its version counter, storage, dtype or device; a write through ``.data``
        bumps no version counter and is not seen: pop ``_step_memo`` from ``__dict__`` after one): a decode step without
        autograd then skips ~10 small kernels a layer (on a GPU, eager decoding is bound by the launches; traced, the
        step computes them, which Inductor fuses)."""
        key = tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in (self.decay_nu, self.theta))
        memo = self.__dict__.get("_step_memo")
        if memo is None or memo[0] != key:
            log_decay, theta = self.log_decay(), at_least_float32(self.theta)  # (H, P) each
            norm = write_norm(log_decay)
            memo = (key, norm, torch.exp(torch.complex(log_decay, -theta)))
            self.__dict__["_step_memo"] = memo
        return memo[1], memo[2]
