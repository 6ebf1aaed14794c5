"""`Mixer`: what every token mixer shares — its options dataclass, the shared checks, the init hook.

A mixer is `Mixer(d_model, n_heads, head_dim=None, *, rotary=None, norm_eps=1e-6, config=None, **options)`:
`head_dim` defaults to d_model / n_heads; `rotary` is the model's `RotaryConfig` (default: its defaults);
`norm_eps` the eps of any norm inside the mixer; `config` an instance of the class's `Config` (its own options
dataclass, validated on construction), or `**options` its fields (`Attention(64, 4, window=16)`), never both.
The options are checked against the stack's shape once, by `Config.check_with(n_heads=, head_dim=, rotary=)`,
the one function `HybridConfig` calls too.

A mixer's `Config` declares what the model needs to know about it:

    state_grows          the decode state grows with the tokens seen (global attention), else fixed size
    cheap_to_recompute   O(T) in time, so recomputing it in backward is cheap (`HybridConfig.recompute`)

Every mixer offers

    forward(x (B, T, d_model), state=None, *, offset=0, cu_seqlens=None, output_final_state=True) -> (y, state)
    step(x (B, d_model), state=None, offset=0) -> (y, state)           offset: int, or (B,) per-row positions
    init_state(batch_size, device=None, dtype=None) -> state

and its states follow `MixerState`. `offset` is the position of x's first token: the number of tokens the
state has seen, 0 for a fresh sequence. States hold no position; the caller keeps it (`HybridState.offset`)
and passes it in, as gpt-fast passes `input_pos`. It is an int (every row at one position) or an int64 tensor
`(B,)`, one position per row (a ragged batch: rows that started at different times, vLLM's state slots), and
`forward` and `step` take both: rotary angles, cache slots and masks are then per row. With `cu_seqlens` (a
packed batch of N sequences) it is 0 (every sequence fresh) or a list of N ints, one per sequence
(`check_offset`).

The decode state API (`MixerState`; docs/decoding.md, "The state API"): the batch axis of every state tensor is
the row (the slot), and

    nbytes                      bytes held
    clone()                     an independent copy (continuing one leaves the other valid)
    cat(states)                 several states as one batch, rows in order, whatever positions they are at
    select(index)               rows `index` (LongTensor (n,)) as a new state
    put(rows, source)           this batch with rows `rows` replaced by `source`'s rows (a finished row's slot
                                takes a new request); may write in place, returns the state to continue
    fork()                      a rollback point: what `rewind` returns to, taken before continuing this state
    rewind(keep, fork)          after continuing from the state `fork()` was taken of: rows where `keep`
                                (BoolTensor (B,)) is False go back to `fork` (speculative decoding's rollback)

A state whose fields are all batch-first tensors, never written in place (R, M), gets all of these from
`hybrid.batch_state.TensorState`; attention's caches implement them with in-place slots.

A mixer with a context-parallel path also takes ``shard=`` in ``forward`` (a
`hybrid.kernels.context_parallel.SequenceShard`: x is this rank's part of one long sequence, positions and
packing come from the shard; training and scoring only, no state in or out, `check_shard_call`) and says so by
overriding ``check_shard`` (the base refuses in one line).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from hybrid.kernels.varlen import on_device

from .checks import check_heads, check_int, check_number, reads_back
from .computed_buffers import WithComputedBuffers
from .rotary import RotaryConfig


@runtime_checkable
class MixerState(Protocol):
    """A mixer's decode state: bytes held, an independent copy, and the row operations of a batch of decode slots
    (the module docstring's table)."""

    @property
    def nbytes(self) -> int: ...

    def clone(self) -> "MixerState": ...

    @classmethod
    def cat(cls, states: list) -> "MixerState": ...

    def select(self, index) -> "MixerState": ...

    def put(self, rows, source: "MixerState") -> "MixerState": ...

    def fork(self) -> "MixerState": ...

    def rewind(self, keep, fork: "MixerState") -> "MixerState": ...


class FixedStateOptions:
    """Base of a mixer `Config` whose decode state has a fixed size and whose cost is O(T) (R, M): the two
    declarations the model reads, as class attributes."""

    state_grows: ClassVar[bool] = False
    cheap_to_recompute: ClassVar[bool] = True


def check_offset(offset, n_sequences: int | None = None, batch: int | None = None):
    """The position `offset` of a call's first token: an int >= 0, or an int64 tensor `(B,)` of per-row positions
    (`batch`: B, when known); with a packed batch of `n_sequences`, a list of that many ints (0 stands for all
    zeros). Returns the int, the tensor (int64) or the list."""
    if isinstance(offset, torch.Tensor):
        if n_sequences is not None:
            raise ValueError(f"offset: expected 0 or a list of N={n_sequences} positions with cu_seqlens, got a tensor")
        if offset.dim() != 1 or offset.dtype not in (torch.int64, torch.int32) or (
                batch is not None and offset.shape[0] != batch):
            # formatted only here: formatting a traced batch size would fix it (a graph per batch size)
            want = "(B,)" if batch is None else f"(B,) = ({batch},)"
            raise ValueError(f"offset: expected an int or an int64 tensor {want} of per-row positions, got a tensor "
                             f"of shape {tuple(offset.shape)} ({str(offset.dtype).removeprefix('torch.')})")
        # checked on the CPU only: off it a read back is a host sync per layer, under torch.compile a graph break
        if reads_back(offset) and offset.numel() and int(offset.min()) < 0:
            raise ValueError(f"offset: expected positions >= 0, got {offset.tolist()}")
        return offset.long()
    if n_sequences is None:
        return check_int("offset", offset, low=0)
    if isinstance(offset, (list, tuple)):
        if len(offset) != n_sequences:
            raise ValueError(f"offset: expected 0 or a list of N={n_sequences} positions with cu_seqlens, "
                             f"got a list of {len(offset)}")
        return [check_int("offset", o, low=0) for o in offset]
    if check_int("offset", offset, low=0) != 0:
        raise ValueError(f"offset: expected 0 or a list of N={n_sequences} positions with cu_seqlens, got {offset!r}")
    return [0] * n_sequences


def check_packed_offset(offset, n_sequences):
    """`check_offset` of a packed call (`cu_seqlens` of `n_sequences`): None for 0 (every sequence starts at
    position 0), else the list of N ints. None rather than N zeros: under torch.compile N is a symbolic size
    (it changes with every batch), and a list of N entries would make Dynamo specialize on it, a recompile per
    document count."""
    if not isinstance(offset, (list, tuple, torch.Tensor)) and check_int("offset", offset, low=0) == 0:
        return None
    return check_offset(offset, n_sequences)


def offset_arguments(offsets, device) -> tuple[torch.Tensor | None, int]:
    """A packed call's per-sequence offsets (a list, or None: every sequence from 0) as the position functions take
    them (``positions_in_sequence``, ``Rotary.cos_sin_packed``): ``(N,)`` int64 on ``device`` or None when all are
    0, and the largest."""
    max_offset = 0 if offsets is None else max(offsets)
    return (None if max_offset == 0 else on_device(offsets, device)), max_offset


def check_shard_call(shard, state, cu_seqlens, output_final_state: bool) -> None:
    """A mixer's ``forward(x, shard=…)`` continues no state and builds none, and takes its packing from the shard."""
    if state is not None:
        raise ValueError(f"state: expected None with shard= (a context-parallel forward starts each sequence "
                         f"fresh), got {type(state).__name__}")
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens: expected None with shard= (the shard holds the packed offsets: "
                         "shard_sequence(..., cu_seqlens=)), got a tensor")
    if output_final_state:
        raise ValueError("output_final_state: expected False with shard= (a context-parallel forward builds no "
                         "decoding state), got True")


def resolve_config(config_cls: type, config, options: dict):
    """The mixer's options: `config` (an instance of `config_cls`), or `config_cls(**options)`."""
    if config is not None:
        if options:
            raise ValueError(f"config: expected either config or options {sorted(options)}, got both")
        if not isinstance(config, config_cls):
            raise ValueError(f"config: expected a {config_cls.__name__}, got {type(config).__name__}")
        return config
    known = {f.name for f in dataclasses.fields(config_cls)}
    for name in options:
        if name not in known:
            raise ValueError(f"{name}: expected an option of {config_cls.__name__} (one of {sorted(known)}), "
                             f"got an unknown name")
    return config_cls(**options)


class Mixer(WithComputedBuffers):
    """Base of the token mixers: resolves and checks the options; holds `d_model`, `n_heads`, `head_dim`,
    `norm_eps`, `config` (the options) and `rotary_config`. Registers no parameters."""

    Config: ClassVar[type]

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 rotary: RotaryConfig | None = None, norm_eps: float = 1e-6, config=None, **options):
        super().__init__()
        head_dim = check_heads(d_model, n_heads, head_dim)
        if rotary is None:
            rotary = RotaryConfig()
        elif not isinstance(rotary, RotaryConfig):
            raise ValueError(f"rotary: expected a RotaryConfig or None, got {type(rotary).__name__}")
        config = resolve_config(self.Config, config, options)
        config.check_with(n_heads=n_heads, head_dim=head_dim, rotary=rotary)
        self.d_model, self.n_heads, self.head_dim = int(d_model), int(n_heads), head_dim
        self.norm_eps = check_number("norm_eps", norm_eps, low=0)
        self.config, self.rotary_config = config, rotary

    def check_shard(self) -> None:
        """Refuse, in one line, a context-parallel forward this mixer (or one of its options) has no path for.
        The base refuses: a mixer opts in by overriding this with the checks of its options."""
        raise ValueError(f"shard: expected a mixer with a context-parallel path, got {type(self).__name__} (its "
                         "forward takes no shard=)")

    def init_weights(self, std: float, depth_std: float) -> None:
        """The model's init, after every Linear and Embedding weight was drawn from N(0, std): the residual
        output projection `out_proj` from N(0, depth_std) (GPT-2's 1/√(2·n_layers) scaling)."""
        nn.init.normal_(self.out_proj.weight, mean=0.0, std=depth_std)
