"""HybridLM: a stack of pre-norm blocks whose token mixers follow the config's pattern.

    h = embed(ids) (+ absolute positions, when config.abs_pos is set)
    for each layer:  h = h + mixer(rmsnorm(h));  h = h + swiglu(rmsnorm(h))
    logits = lm_head(rmsnorm(h))                      (lm_head tied to the embedding by default)

Three modes give the same logits (to float rounding) and return a state that continues the sequence:

    parallel    every layer sees the whole input at once (training)
    chunked     blocks of ``chunk_size`` tokens, each continuing the state (long prompts, bounded memory)
    recurrent   one token at a time through each mixer's ``step`` (decoding; O(1) per token when every
                attention layer is windowed)

The position is kept once, in ``HybridState.offset`` (the tokens seen), and passed down to every mixer as its
``offset`` (gpt-fast's ``input_pos``); layer states hold none. One token continuing a state is a decode step in
any mode: ``step``, ``forward`` at T = 1 with a state (the Hugging Face wrapper's decoding) and ``generate``
(``models/generation.py``) all take that one route. A ragged batch (``HybridState.offset`` a ``(B,)`` tensor: rows
at their own positions, ``models/decoding``) continues in every mode alike, each row at its own position.
"""
from __future__ import annotations

import bisect
import math
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from hybrid import RMSNorm, SwiGLU
from hybrid.abs_pos import AbsolutePositions, packed_positions, sinusoidal_scale

from hybrid.checks import check_int, check_sequence_states, reads_back
from hybrid.computed_buffers import restore_computed_buffers
from hybrid.kernels.varlen import (PackedOffsets, dynamic_count, host_offsets, packed_offsets,
                                   positions_in_sequence)
from hybrid.mixer import offset_arguments
from hybrid.rotary.module import forget_rows

from .config import HybridConfig
from .context_parallel import forward_shard
from .generation import generate as generate_tokens
from .materialize import check_sharded_draws, reset_in_build_order, sharded_parameters_take_plain_tensors
from .mixers import build_mixer
from .modes import DEFAULT_CHUNK_SIZE, MODES
from .state import HybridState


class Block(nn.Module):
    """Pre-RMSNorm → mixer → residual → RMSNorm → SwiGLU → residual."""

    def __init__(self, config: HybridConfig, letter: str):
        super().__init__()
        self.mixer_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mixer = build_mixer(config, letter)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = SwiGLU(config.d_model, hidden=config.mlp_hidden, mlp_ratio=config.mlp_ratio)

    def forward(self, x: torch.Tensor, state, offset=0, cu_seqlens: torch.Tensor | None = None,
                output_final_state: bool = True, shard=None):
        """x ``(B, T, d_model)`` from position ``offset``: the parallel / chunk form (``cu_seqlens``: a packed batch,
        ``offset`` 0 or one position per sequence; ``shard``: this rank's part of one long sequence; see
        ``HybridLM``)."""
        extra = {} if shard is None else {"shard": shard}  # only context-parallel mixers take a shard
        h, state = self.mixer(self.mixer_norm(x), state, offset=offset, cu_seqlens=cu_seqlens,
                              output_final_state=output_final_state, **extra)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), state

    def step(self, x: torch.Tensor, state, offset):
        """x ``(B, d_model)``: one token at position ``offset`` (an int, or ``(B,)`` per-row positions)."""
        h, state = self.mixer.step(self.mixer_norm(x), state, offset)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), state


class HybridLM(nn.Module):
    """A language model over the config's mixer pattern. ``model(ids, mode=...) -> (logits, state)``."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        if not isinstance(config, HybridConfig):
            raise ValueError(f"config: expected a HybridConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.abs_pos = None if config.abs_pos is None else AbsolutePositions(
            config.abs_pos, config.d_model, max_len=config.abs_pos_max_len, scale=sinusoidal_scale(config.init_std))
        self.blocks = nn.ModuleList(Block(config, letter) for letter in config.layer_types)
        self._recompute = [self._recomputes(block.mixer) for block in self.blocks]
        self._block_calls = None  # what runs the blocks instead of themselves (``blocks_run_as``), or None
        self.norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.to(config.torch_dtype)

    def to_empty(self, *, device, recurse: bool = True) -> "HybridLM":
        """``nn.Module.to_empty``: the buffers computed from the config (rotary frequencies, the schedule's angles)
        are written back (``hybrid.computed_buffers``: no state dict holds them), so a model built on the meta
        device computes correctly once a state dict is loaded, or ``init_weights()`` called; a tied LM head stays
        tied (moving off the meta device makes a new parameter of each tensor)."""
        super().to_empty(device=device, recurse=recurse)
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        return self

    @torch.no_grad()
    def init_weights(self) -> None:
        """Draw every parameter again as the constructor does, and write the computed buffers back: for a model
        built on the meta device (``with torch.device("meta"): HybridLM(config)``, then ``fully_shard`` and
        ``to_empty(device=...)``; docs/training.md, "A model larger than one device"). On one device, under the
        same seed, the values equal a model built directly. Sharded (FSDP2) over an accelerator's mesh, DTensor's
        generator draws each rank's shards (the same distributions, other values); a CPU mesh is refused."""
        check_sharded_draws(self)
        restore_computed_buffers(self)
        with sharded_parameters_take_plain_tensors():
            reset_in_build_order(self)
            self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """N(0, init_std) for linear and embedding weights; residual output projections scaled by
        1/√(2·n_layers) (GPT-2): the MLP's here, the mixer's by its ``init_weights`` hook. Mixer-specific
        parameters (decays, gates, CARoPE) keep their own init, and retention (M) layers keep RetNet's
        published initialisation (their hook), so the baseline is the baseline. A tied LM head draws its
        N(0, init_std) aside, as the constructor drew it before tying, and the embedding keeps its own draw."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                tied = module is self.lm_head and self.lm_head.weight is self.embed.weight
                nn.init.normal_(torch.empty_like(module.weight) if tied else module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        depth_std = std / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.mlp.w_down.weight, mean=0.0, std=depth_std)
            block.mixer.init_weights(std, depth_std)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters, or without the token and (learned) position embedding tables."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.embed.weight.numel()
            if self.abs_pos is not None and self.abs_pos.kind == "learned":
                n -= self.abs_pos.table.weight.numel()
        return n

    def _embed(self, ids: torch.Tensor, offset) -> torch.Tensor:
        """Token embeddings ``(B, T, d)`` (or ``(B, d)`` for one step) plus absolute positions offset … offset+T−1
        (``offset`` an int, or ``(B,)`` per-row positions)."""
        h = self.embed(ids)
        if self.abs_pos is None:
            return h
        T = ids.shape[1] if ids.dim() == 2 else 1
        if isinstance(offset, torch.Tensor):  # a ragged batch: each row's own positions
            pos = offset[:, None] + torch.arange(T, device=offset.device)  # (B, T)
            vectors = self.abs_pos.at(pos.flatten(), device=h.device, dtype=h.dtype)  # (B·T, d), no host read
            vectors = vectors.unflatten(0, pos.shape)  # (B, T, d)
            return h + (vectors if ids.dim() == 2 else vectors[:, 0])
        pos = self.abs_pos(offset, T, device=h.device, dtype=h.dtype)  # (T, d)
        return h + (pos if ids.dim() == 2 else pos[0])

    # ------------------------------------------------------------------------------------------ state

    def init_state(self, batch_size: int, device=None, dtype: torch.dtype | None = None) -> HybridState:
        """An empty state (no tokens seen) for ``batch_size`` sequences, on the model's device and in its dtype
        unless given."""
        device = device if device is not None else self.embed.weight.device
        dtype = dtype if dtype is not None else self.embed.weight.dtype
        return HybridState(layers=[block.mixer.init_state(batch_size, device, dtype) for block in self.blocks])

    def _check_state(self, state, batch_size: int) -> HybridState:
        if state is None:
            return self.init_state(batch_size)
        if not isinstance(state, HybridState):
            raise ValueError(f"state: expected a HybridState or None, got {type(state).__name__}")
        if len(state.layers) != len(self.blocks):
            raise ValueError(f"state: expected {len(self.blocks)} layer states, got {len(state.layers)}")
        if state.ragged and tuple(state.offset.shape) != (batch_size,):
            raise ValueError(f"state: expected per-row positions of shape ({batch_size},) (one per input row), got "
                             f"{tuple(state.offset.shape)}")
        return state

    def check_ids(self, input_ids, name: str = "input_ids", shape: str = "(B, T)") -> None:
        """``input_ids`` is an int tensor of ``shape`` holding ids in ``[0, vocab_size)`` (checked on the device,
        without a host sync, off the CPU)."""
        ndim = len([axis for axis in shape.strip("()").split(",") if axis.strip()])
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
            got = input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"{name}: expected an int64 tensor of shape {shape}, got {got}")
        if input_ids.dim() != ndim:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(input_ids.shape)}")
        if not input_ids.numel():
            return
        V = self.config.vocab_size
        if not reads_back(input_ids):
            # no host sync in the training loop: the device raises when the ids are out of range
            torch._assert_async(((input_ids >= 0) & (input_ids < V)).all(), f"{name}: expected token ids in [0, {V})")
        elif int(input_ids.min()) < 0 or int(input_ids.max()) >= V:
            raise ValueError(
                f"{name}: expected token ids in [0, {V}), got values in "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]"
            )

    # ------------------------------------------------------------------------------------------ forward

    def forward(self, input_ids: torch.Tensor, mode: str = "parallel", state: HybridState | None = None,
                chunk_size: int | None = None, *, cu_seqlens: torch.Tensor | None = None,
                output_final_state: bool = True, shard=None):
        """Logits ``(B, T, vocab_size)`` for ``input_ids`` ``(B, T)``, continuing ``state``; returns
        ``(logits, new_state)`` (``new_state`` None with ``output_final_state=False``: training builds no
        decoding state).

        One token continuing a state (T = 1, ``state`` given) is a decode step whatever ``mode``: the route of
        ``step`` and ``generate``.

        ``cu_seqlens`` (LongTensor ``(N+1,)``, ``hybrid.kernels.varlen``): ``input_ids`` ``(1, total_T)`` packs N
        sequences; every mixer restarts at each offset, and rotary and absolute positions restart at 0 (or at
        the sequence's state offset). ``state`` is then None or a list of N ``HybridState | None`` (batch 1
        each), and the returned state is such a list.

        ``shard`` (``hybrid.kernels.context_parallel.SequenceShard``, context parallelism): ``input_ids`` is this
        rank's part of one long sequence (``(B, L)``, or ``(1, L)`` when the shard packs documents) and the logits
        are this part of one rank's logits (``models/context_parallel.py``): parallel mode, no state.
        """
        self.check_ids(input_ids)
        if shard is not None:
            return forward_shard(self, input_ids, shard, mode=mode, state=state, chunk_size=chunk_size,
                                 cu_seqlens=cu_seqlens, output_final_state=output_final_state)
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        check_int("chunk_size", chunk_size, low=1, allow_none=True, what="a positive int")
        B, T = input_ids.shape
        if cu_seqlens is not None:
            return self._forward_packed(input_ids, mode, state, chunk_size, cu_seqlens, output_final_state)
        decode_step = T == 1 and state is not None  # one token continuing a state
        if state is None and not output_final_state:  # no decoding state: the mixers start from zeros
            state = HybridState(layers=[None] * len(self.blocks))
        state = self._check_state(state, B)
        if T == 0:
            return self.lm_head.weight.new_zeros(B, 0, self.config.vocab_size), (state if output_final_state else None)
        if mode == "recurrent" or decode_step:
            logits = []
            for t in range(T):
                step_logits, state = self._step(input_ids[:, t], state)
                logits.append(step_logits)
            return torch.stack(logits, dim=1), (state if output_final_state else None)
        if mode == "parallel":  # one block, no loop over T: a range over T would fix its value under torch.compile
            return self._forward_block(input_ids, state, output_final_state)
        size = chunk_size or DEFAULT_CHUNK_SIZE
        logits = []
        for start in range(0, T, size):
            keep = output_final_state or start + size < T  # a later chunk continues this state
            chunk_logits, state = self._forward_block(input_ids[:, start:start + size], state, keep)
            logits.append(chunk_logits)
        return (logits[0] if len(logits) == 1 else torch.cat(logits, dim=1)), state

    def _forward_packed(self, input_ids, mode: str, states, chunk_size, cu_seqlens, output_final_state: bool):
        """``forward`` on a packed batch: per-sequence states in and out (see ``forward``)."""
        T = input_ids.shape[1]
        # the one check of the batch's offsets: every layer and op takes them as they are (no read back per layer)
        packed = packed_offsets(cu_seqlens, T, input_ids.device, batch=input_ids.shape[0])
        N = packed.num_sequences
        states = check_sequence_states(states, N, lambda st: self._check_state(st, 1), "HybridStates")
        if mode == "parallel" and states is None:
            return self._forward_block_packed(input_ids, packed, None, output_final_state)
        bounds = host_offsets(packed)
        doc_states = list(states) if states is not None else [None] * N
        if mode == "recurrent":  # each sequence on its own, one token at a time
            logits = []
            for n in range(N):
                doc_logits, doc_states[n] = self(input_ids[:, bounds[n]:bounds[n + 1]], mode="recurrent",
                                                 state=doc_states[n])
                logits.append(doc_logits)
            return torch.cat(logits, dim=1), (doc_states if output_final_state else None)
        size = T if mode == "parallel" else (chunk_size or DEFAULT_CHUNK_SIZE)
        logits = []
        for start in range(0, T, size):  # a chunk holds the parts of the sequences that overlap it
            end = min(start + size, T)
            first = bisect.bisect_right(bounds, start) - 1  # the sequence holding the chunk's first token
            last = bisect.bisect_left(bounds, end) - 1  # ... and its last
            cu = [max(bounds[n], start) - start for n in range(first, last + 1)] + [end - start]
            cu_chunk = PackedOffsets.from_bounds(cu, device=input_ids.device, dtype=packed.cu_seqlens.dtype)
            keep = output_final_state or end < T
            chunk_logits, chunk_states = self._forward_block_packed(
                input_ids[:, start:end], cu_chunk, doc_states[first:last + 1], keep)
            if keep:
                doc_states[first:last + 1] = chunk_states
            logits.append(chunk_logits)
        return torch.cat(logits, dim=1), (doc_states if output_final_state else None)

    def _recomputes(self, mixer) -> bool:
        """Whether ``config.recompute`` asks this mixer's block to recompute its activations in backward:
        "linear" picks the mixers whose options declare ``cheap_to_recompute`` (R, M, windowed A: O(T))."""
        mode = self.config.recompute
        return mode == "all" or (mode == "linear" and mixer.config.cheap_to_recompute)

    @contextmanager
    def blocks_run_as(self, calls):
        """Inside, block i runs as ``calls[i]`` (a callable with the block's signature: the block under
        ``torch.compile``, ``models/compiled.py``). A packed batch's offsets then reach the blocks as a traced
        model sees them: the device tensor alone, marked as of a varying length, so that no compiled block guards
        on their host values or count (one graph for every packing)."""
        if len(calls) != len(self.blocks):
            raise ValueError(f"calls: expected one per block ({len(self.blocks)}), got {len(calls)}")
        previous, self._block_calls = self._block_calls, list(calls)
        try:
            yield self
        finally:
            self._block_calls = previous

    def _run_blocks(self, h: torch.Tensor, layer_states, offset, cu_seqlens, output_final_state: bool, shard=None):
        """Every block over h ``(B, T, d_model)`` from position ``offset`` (with ``cu_seqlens``: 0 or one per
        sequence; ``shard``: a context-parallel shard); returns the final hidden states' logits and the layer
        states."""
        layers = []
        records = torch.is_grad_enabled() and self.training
        blocks = self.blocks if self._block_calls is None else self._block_calls
        if self._block_calls is not None and isinstance(cu_seqlens, PackedOffsets):
            cu_seqlens = cu_seqlens.without_host_values(dynamic_count(cu_seqlens.cu_seqlens))
        for block, layer_state, recompute in zip(blocks, layer_states, self._recompute):
            if recompute and records:
                # activation checkpointing: keep h, run the block again in backward. Under autograd every
                # state update is out of place (hybrid.kv_cache), so the second run sees the same inputs. With a
                # shard the second run must repeat every collective of the first, on every rank: no early stop.
                with nullcontext() if shard is None else set_checkpoint_early_stop(False):
                    h, layer_state = checkpoint(block, h, layer_state, offset, cu_seqlens, output_final_state, shard,
                                                use_reentrant=False)
            else:
                h, layer_state = block(h, layer_state, offset, cu_seqlens, output_final_state, shard)
            layers.append(layer_state)
        return self.lm_head(self.norm(h)), layers

    def _forward_block(self, ids: torch.Tensor, state: HybridState, output_final_state: bool = True):
        forget_rows()  # the layers of this block share one per-row rotary table, no other call's
        h = self._embed(ids, state.offset)  # (B, T, d_model)
        logits, layers = self._run_blocks(h, state.layers, state.offset, None, output_final_state)
        if not output_final_state:
            return logits, None
        return logits, HybridState(layers=layers, offset=state.offset + ids.shape[1])

    def _forward_block_packed(self, ids: torch.Tensor, packed: PackedOffsets, states, output_final_state: bool):
        """One packed block (``packed``: its checked offsets): ``states`` None or a list of N ``HybridState | None``;
        returns logits and the per-sequence states (or None)."""
        N = packed.num_sequences
        offsets = None if states is None else [0 if st is None else (int(st.offset[0]) if st.ragged else st.offset)
                                                for st in states]
        h = self.embed(ids)  # (1, T, d_model)
        if self.abs_pos is not None:
            off_t, max_offset = offset_arguments(offsets, ids.device)
            pos = positions_in_sequence(packed.cu_seqlens, ids.shape[1], off_t)  # (T,)
            h = h + packed_positions(self.abs_pos, pos, ids.shape[1] + max_offset, device=h.device, dtype=h.dtype)
        layer_states = [None] * len(self.blocks)
        if states is not None and any(st is not None for st in states):
            layer_states = [[None if st is None else st.layers[i] for st in states] for i in range(len(self.blocks))]
        logits, layers = self._run_blocks(h, layer_states, 0 if offsets is None else offsets, packed,
                                          output_final_state)
        if not output_final_state:
            return logits, None
        bounds = host_offsets(packed)
        lens = [b - a for a, b in zip(bounds, bounds[1:])]
        return logits, [HybridState(layers=[layer[n] for layer in layers], offset=(offsets[n] if offsets else 0) + lens[n])
                        for n in range(N)]

    def step(self, token_ids: torch.Tensor, state: HybridState | None = None):
        """One token per sequence: ``token_ids`` ``(B,)`` -> (logits ``(B, vocab_size)``, new state)."""
        self.check_ids(token_ids, "token_ids", "(B,)")
        return self._step(token_ids, self._check_state(state, token_ids.shape[0]))

    def _step(self, token_ids: torch.Tensor, state: HybridState):
        """``step`` on checked ids and state: the one decode route (``step``, ``forward`` at T = 1 with a state,
        the recurrent mode, ``generate``)."""
        forget_rows()  # the layers of this step share one per-row rotary table, no other step's
        h = self._embed(token_ids, state.offset)  # (B, d_model)
        layers = []
        for block, layer_state in zip(self.blocks, state.layers):
            h, layer_state = block.step(h, layer_state, state.offset)
            layers.append(layer_state)
        return self.lm_head(self.norm(h)), HybridState(layers=layers, offset=state.offset + 1)

    # ------------------------------------------------------------------------------------------ generate

    def generate(self, input_ids, max_new_tokens: int, **options):
        """Continue ``input_ids`` ``(B, T)`` by up to ``max_new_tokens`` tokens; returns ``(B, T + n)``. A list of
        prompts of any lengths (or a padded batch with ``attention_mask`` / ``lengths``) returns a list of rows.

        ``options``: ``mode``, ``prefill``, ``temperature``, ``top_k``, ``top_p``, ``generator``, ``eos_token_id``,
        ``chunk_size``, ``vocab_limit``, ``attention_mask``, ``lengths``, ``draft``, ``lookahead``, ``compile``. The
        decode loop lives outside the model, in ``hybrid.models.generation.generate(self, input_ids,
        max_new_tokens, **options)``, whose docstring says what each does."""
        return generate_tokens(self, input_ids, max_new_tokens, **options)
