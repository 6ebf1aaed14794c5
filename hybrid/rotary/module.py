"""`Rotary`: a frequency schedule plus a cos/sin cache, applied to `(B, T, H, D)` tensors."""
from __future__ import annotations

import torch

from hybrid.checks import check_even_dim, check_float_tensor, check_int, check_positive_int
from hybrid.computed_buffers import WithComputedBuffers, register_computed_buffer
from hybrid.kernels.varlen import lengths, on_device, positions_in_sequence, sequence_ids

from .apply import apply_rotary, check_layout, cos_sin_from_angles, rotary_angles
from .schedules import dynamic_frequencies, inv_freq, length_dependence


def _check_count(name: str, v) -> int:
    """An int ≥ 0 (python/numpy int or 0-dim integer tensor)."""
    return check_int(name, v, low=0)


# cos_sin_rows's last answer, shared by every Rotary of equal schedule: (positions tensor, key, (cos, sin))
_LAST_ROWS: list = [None]


def forget_rows() -> None:
    """Drop ``cos_sin_rows``'s last answer. A model calls it before each step: the answer is for the layers of one
    step (a CUDA graph's replay rewrites a positions tensor without touching its version counter)."""
    _LAST_ROWS[0] = None


class Rotary(WithComputedBuffers):
    """Rotary position embedding for heads of size `dim`, rotating the first `R = rotary_dim or dim` channels.

    θ = `inv_freq(R, base, scaling)` (see `schedules`); position m rotates pair i by m·θ_i. The rotation is
    orthogonal: the schedule's `attention_factor` (YaRN/LongRoPE temperature, 1 otherwise) is *not* folded
    into cos/sin; attention applies it (HF scales cos and sin by it, i.e. logits by attention_factor²).

    Attributes: `inv_freq` (non-persistent float32 buffer `(R/2,)`, the frequencies for lengths ≤ L0),
    `attention_factor` (float), `dim`, `rotary_dim`, `layout`, `base`, `scaling`.

    For `dynamic` and `longrope` scaling the frequencies depend on the total length `offset + seq_len`
    (dynamic: recomputed for every total above L0; longrope: long factors above L0), evaluated afresh on
    each call; HF instead keeps the longest length seen. Positions computed earlier under other frequencies
    (e.g. a KV cache) are not re-rotated, as in HF. Every row is computed on the device it is asked for: no call
    copies from the host or reads a value back once a table is built (a decode step past L0 included).
    """

    inv_freq: torch.Tensor
    table_limit = 1 << 20  # longest cached cos/sin table; positions beyond it are computed per call

    def __init__(self, dim: int, *, base: float = 10000.0, scaling: dict | None = None,
                 layout: str = "interleaved", rotary_dim: int | None = None):
        super().__init__()
        check_positive_int("dim", dim)
        R = check_even_dim("dim", dim) if rotary_dim is None else check_even_dim("rotary_dim", rotary_dim, at_most=dim, at_most_name="dim")
        check_layout("layout", layout)
        self.dim, self.rotary_dim, self.layout = int(dim), int(R), layout
        theta, self.attention_factor = inv_freq(int(R), base, scaling)  # validates scaling
        self.base, self.scaling = float(base), None if scaling is None else dict(scaling)
        self._theta = theta  # on the host (under any default device, meta included), float32 whatever module.to
        self._rope_type, self._threshold = length_dependence(self.scaling, self.rotary_dim)
        if self._rope_type == "longrope":  # the long factors' frequencies, for any total past the threshold
            self._theta_long = inv_freq(int(R), base, scaling, seq_len=self._threshold + 1)[0]
        register_computed_buffer(self, "inv_freq", theta)
        self._tables: dict = {}  # (frequency key, device) -> (cos, sin), each (n, R/2) for positions 0 … n−1
        self._thetas: dict = {}  # (frequency key, device) -> θ (R/2,) float32 on that device
        self._last = None        # (key, device, offset, seq_len, cos, sin) for rows computed per call
        self._schedule_key = (int(R), self.base, repr(self.scaling))  # equal keys, equal frequencies

    def extra_repr(self) -> str:
        scaling = "" if self.scaling is None else f", scaling={self.scaling}"
        return (f"dim={self.dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
                f"layout={self.layout!r}{scaling}")

    @property
    def length_dependent(self) -> bool:
        """The frequencies change with the total length (``dynamic`` / ``longrope`` scaling past their L0)."""
        return self._threshold is not None

    def cos_sin_shard(self, shard, device=None):
        """`(cos, sin)`, each `(L, R/2)`, at the positions of a context-parallel shard's tokens
        (`hybrid.kernels.context_parallel.SequenceShard`: from its global offset, per document when packed)."""
        if shard.cu_seqlens is None:
            return self.cos_sin(shard.length, offset=shard.start, device=device)
        offsets = on_device(shard.piece_offsets, shard.cu_seqlens.device)
        return self.cos_sin_packed(shard.cu_seqlens, shard.length, offsets, max(shard.piece_offsets), device=device)

    def _frequency_key(self, total: int):
        """Which frequencies a call of this total length uses: "base" (the plain / short ones) or "long"
        (longrope's), each with a reusable table, or the int total for dynamic NTK's, which are its own."""
        if self._threshold is None or total <= self._threshold:
            return "base"
        return "long" if self._rope_type == "longrope" else total

    def _host_theta(self, key: str) -> torch.Tensor:
        """θ `(R/2,)` float32 on the host of a table key: "long" (longrope's long factors) or "base"."""
        return self._theta_long if key == "long" else self._theta

    def _theta_on(self, key: str, device) -> torch.Tensor:
        """θ `(R/2,)` float32 of a table key ("base" or "long") on ``device``. Moving the module puts them on its
        device (`_apply`), so a step finds them there and copies nothing from the host; another device gets its
        copy at its first call (while Dynamo traces: not stored, the copy a constant of the graph). The plain
        frequencies are the ``inv_freq`` buffer itself where it holds them exactly (float32, or float64 after
        ``model.double()``) on that device."""
        if key == "base" and self.inv_freq.device == device and self.inv_freq.dtype in (torch.float32, torch.float64):
            return self.inv_freq
        cached = self._thetas.get((key, device))
        if cached is not None:
            return cached
        theta = self._host_theta(key).to(device)
        if not torch.compiler.is_compiling():
            self._thetas[(key, device)] = theta
        return theta

    def _apply(self, fn, recurse=True):
        """``module.to(...)`` / ``.cuda()`` / ``.half()``: the buffers move (``inv_freq`` cast with the rest), and the
        float32 frequencies are copied to their device here, once, outside any step: a decode step of a model cast
        to bfloat16 read them from the host at every call (a sync on a GPU; a CUDA graph refused it)."""
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        self._thetas = {(key, device): self._theta_on(key, device)
                        for key in (("base", "long") if self._rope_type == "longrope" else ("base",))}
        return self

    def _theta_at_totals(self, totals: torch.Tensor) -> torch.Tensor:
        """θ `(N, R/2)` float32 on the totals' device, row n the frequencies a call of total length `totals[n]`
        (`(N,)` int64) uses: the plain ones up to the threshold, past it longrope's long ones or dynamic NTK's
        for that total. From the totals' values on their device: nothing is read back."""
        plain = self._theta_on("base", totals.device).float()  # (R/2,) (the buffer's float64 holds float32 values)
        if self._rope_type == "longrope":
            past = self._theta_on("long", totals.device)[None]  # (1, R/2)
        else:
            past = dynamic_frequencies(self.rotary_dim, self.base, self.scaling, totals)  # (N, R/2)
        return torch.where((totals > self._threshold)[:, None], past, plain)

    @staticmethod
    def _cos_sin_at(positions: torch.Tensor, theta: torch.Tensor, device):
        cos, sin = cos_sin_from_angles(rotary_angles(positions, theta))  # (n, R/2) float32
        return cos.to(device), sin.to(device)

    @staticmethod
    def _cos_sin_per_row(positions: torch.Tensor, theta: torch.Tensor):
        """`(cos, sin)` `(..., R/2)` float32 of integer positions `(...)` at frequencies of their own, `theta`
        broadcastable to `(..., R/2)`: float64 angles, one rounding, as `rotary_angles` computes them for one set."""
        return cos_sin_from_angles(positions.to(torch.float64)[..., None] * theta.to(torch.float64))

    def _rows_on_device(self, key, offset: int, total: int, device):
        """`(cos, sin)` for positions offset … total − 1 computed on ``device`` (positions and frequencies there:
        no copy from the host): dynamic NTK's frequencies at this total (int key), else a table key's."""
        if isinstance(key, int):
            theta = self._theta_at_totals(torch.full((1,), total, dtype=torch.int64, device=device))[0]
        else:
            theta = self._theta_on(key, device)
        return self._cos_sin_at(torch.arange(offset, total, device=device), theta, device)

    def cos_sin(self, seq_len: int, offset: int = 0, device=None):
        """`(cos, sin)`, each `(seq_len, R/2)` float32, for positions offset … offset + seq_len − 1.

        Angles are computed in float64 from int64 positions (exact for large offsets) and rounded once.
        Tables for positions 0 … n−1 are cached per (frequencies, device) and grown geometrically up to
        `table_limit`; past it (and for dynamic NTK above L0, whose frequencies depend on the total length)
        the requested rows are computed on the device, and only the last result is kept. The returned tensors
        may be views into the cache: do not modify them in place.
        """
        seq_len, offset = _check_count("seq_len", seq_len), _check_count("offset", offset)
        device = self.inv_freq.device if device is None else torch.device(device)
        total = offset + seq_len
        if torch.compiler.is_compiling():
            return self._cos_sin_traced(offset, total, device)
        key = self._frequency_key(total)
        if isinstance(key, int) or total > self.table_limit:  # rows for this call only
            last = self._last
            if last is None or last[:4] != (key, device, offset, seq_len):
                self._last = (key, device, offset, seq_len, *self._rows_on_device(key, offset, total, device))
            return self._last[4], self._last[5]
        table = self._tables.get((key, device))
        if table is None or table[0].shape[0] < total:
            n = min(max(total, 2 * (0 if table is None else table[0].shape[0]), 16), self.table_limit)
            table = self._cos_sin_at(torch.arange(n, dtype=torch.int64), self._host_theta(key), device)
            self._tables[(key, device)] = table
        return table[0][offset:total], table[1][offset:total]

    def _cos_sin_traced(self, offset, total, device):
        """The rows of ``cos_sin`` inside a torch.compile graph, computed there on ``device`` (T × R/2 cos and sin a
        call) and never cached: a table or frequency stored while Dynamo traces is a side effect its guards then
        see ("not in the dict" holds for the first trace only), so a cache cost every compiled model a second
        whole compile at its second call, and one more at every call past a dynamic / longrope threshold. Past
        the threshold, longrope's long frequencies (computed once, at construction) or dynamic NTK's for this total
        length, computed in the graph as eager computes them."""
        return self._rows_on_device(self._frequency_key(total), offset, total, device)

    def cos_sin_rows(self, offsets: torch.Tensor, seq_len: int, device=None):
        """`(cos, sin)`, each `(B, seq_len, 1, R/2)` float32 (broadcast over heads): row b at positions
        `offsets[b] … offsets[b] + seq_len − 1` (a ragged batch, one position per row).

        Each row gets the rows `cos_sin(seq_len, offsets[b])` gives it: computed on the positions' device from the
        int64 positions, as the table is (float64 angles, one rounding; bit for bit the table's on the CPU), so a
        decode step reads nothing back to the host. Where the frequencies depend on the length (dynamic /
        longrope), each row's come from its own total length `offsets[b] + seq_len`, computed there too
        (`_theta_at_totals`): a CUDA graph of the step holds them.

        The layers of one decode step ask for the same rows: the last answer is kept, for the same positions
        tensor (unchanged since) and schedule, outside torch.compile, where it saves every attention layer after
        the first ~10 small ops a token.
        """
        seq_len = _check_count("seq_len", seq_len)
        device = offsets.device if device is None else torch.device(device)
        memo_key = None
        if not torch.compiler.is_compiling():
            memo_key = (offsets._version, seq_len, device, self._schedule_key)
            memo = _LAST_ROWS[0]
            if memo is not None and memo[0] is offsets and memo[1] == memo_key:
                return memo[2]
        positions = offsets.long()[:, None] + torch.arange(seq_len, device=offsets.device)  # (B, T)
        if self._threshold is not None:  # (B, R/2): each row's frequencies at its own total length
            theta = self._theta_at_totals(offsets.long() + seq_len)[:, None]  # (B, 1, R/2)
            cos, sin = self._cos_sin_per_row(positions, theta)
            cos, sin = cos.to(device), sin.to(device)  # (B, T, R/2)
        else:
            cos, sin = self._cos_sin_at(positions, self._theta_on("base", offsets.device), device)  # (B, T, R/2)
        out = cos[:, :, None], sin[:, :, None]  # (B, T, 1, R/2)
        if memo_key is not None:
            _LAST_ROWS[0] = (offsets, memo_key, out)
        return out

    def cos_sin_packed(self, cu_seqlens: torch.Tensor, total: int, offsets: torch.Tensor | None = None,
                       max_offset: int = 0, device=None):
        """`(cos, sin)`, each `(total, R/2)` float32, for a packed batch (`hybrid.kernels.varlen`): token t of
        sequence n at position `offsets[n] + t − cu_seqlens[n]` (offsets default 0; `max_offset` ≥ every offset).

        Each sequence gets exactly the rows it would get run alone: rows of the shared table, or, where the
        frequencies depend on the length (dynamic / longrope past their threshold), the frequencies of its own
        total length `offsets[n] + its length`, computed on the offsets' device (`_theta_at_totals`: no value
        read back).
        """
        bound = total + max_offset
        if self._threshold is not None and bound > self._threshold:  # per sequence, at its own total length
            cu = cu_seqlens.to(cu_seqlens.device if device is None else device).long()
            offsets = None if offsets is None else offsets.to(cu.device).long()
            totals = lengths(cu) if offsets is None else lengths(cu) + offsets  # (N,)
            theta = self._theta_at_totals(totals)[sequence_ids(cu, total)]  # (total, R/2): each token's sequence's
            pos = positions_in_sequence(cu, total, offsets)  # (total,)
            return self._cos_sin_per_row(pos, theta)  # (total, R/2) each
        cos, sin = self.cos_sin(bound, 0, device)  # (bound, R/2): positions 0 … bound − 1
        pos = positions_in_sequence(cu_seqlens, total, offsets).to(cos.device)  # (total,)
        return cos[pos], sin[pos]

    def forward(self, x: torch.Tensor, offset: int = 0, inverse: bool = False) -> torch.Tensor:
        """Rotate x `(B, T, H, dim)` at positions offset … offset + T − 1 (`inverse=True`: by −angle)."""
        check_float_tensor("x", x)  # an integer tensor would be rotated and truncated back to integers
        if x.dim() != 4 or x.shape[-1] != self.dim:
            raise ValueError(f"x: expected shape (B, T, H, dim={self.dim}), got {tuple(x.shape)}")
        cos, sin = self.cos_sin(x.shape[1], offset, x.device)
        return apply_rotary(x, cos, sin, inverse=inverse, layout=self.layout, rotary_dim=self.rotary_dim)
