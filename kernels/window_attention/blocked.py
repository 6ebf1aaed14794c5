"""Block-local sliding-window attention: O(T·w) time and memory on any device, through SDPA.

Queries are cut into blocks of `b ≥ w` tokens. Query block n only sees keys of its own block and of the block
before it (a query's window reaches back w − 1 ≤ b − 1 tokens), so each block attends over 2b keys with one
`(b, 2b)` band mask. The key sequence is padded in front so that the tokens before the queries (at most
w − 1 of them are visible) fill the tail of "block −1"; the padded slots only occur in the first block, which
gets its own mask. No tensor has a T × S dimension: the largest are the `(B, n, 2b, G, D)` key/value blocks
(twice the keys) and SDPA's per-block scores.

Packed sequences (`cu_seqlens`, B = 1): each sequence keeps its last `min(P_n, w − 1)` prefix keys (the only
ones its queries can see) and its own; laid end to end they form one key stream in which every query has a
slot of its own (prefix slots get a zero query whose output is dropped). The same blocks run over that stream
with a same-sequence mask per block, `(n_blocks, b, 2b)` bool broadcast over heads: O((T + N·w)·w), exact.

Global causal attention (`window` None): one sequence takes one SDPA call (`is_causal`, or a `(T, S)` bool mask
with a prefix). Packed sequences take the packed band with a window as long as the longest sequence, so the
largest tensors are O(total · max_len) (the `(n_blocks, b, 2b)` mask with b = max_len: about
2·total·max_len bytes), never `total × total_k`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..varlen import device_offsets, host_offsets, on_device, sequence_ids

# enable_gqa (torch ≥ 2.5) lets SDPA broadcast kv heads without materialising them.
SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
# Packed global attention with prefixes runs SDPA's causal kernel once per sequence up to this many sequences;
# beyond, one band over the stream (fewer, larger calls).
MAX_CAUSAL_CALLS = 64
# Smallest query block: tiny windows would otherwise launch one tiny SDPA problem per w tokens.
MIN_BLOCK = 16


def sdpa_bthd(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, is_causal: bool = False) -> Tensor:
    """SDPA on `(..., T, H, D)` queries and `(..., S, G, D)` keys/values; mask bool broadcastable to
    `(..., H, T, S)` (True = attend). Broadcasts kv heads with `enable_gqa` where the kernel does it itself
    (CPU, or no mask); CUDA's masked kernel does not, so kv heads are repeated there."""
    lead = q.shape[:-3]
    if len(lead) > 1:  # fused kernels (CPU flash, CUDA flash / memory-efficient) take one batch dimension
        q, k, v = (t.flatten(0, len(lead) - 1) for t in (q, k, v))  # (N, T|S, heads, D)
    q, k, v = q.transpose(-3, -2), k.transpose(-3, -2).to(q.dtype), v.transpose(-3, -2).to(q.dtype)  # (…, heads, ·, D)
    H, G = q.shape[-3], k.shape[-3]
    extra = {}
    if H != G:
        if SDPA_GQA and (mask is None or q.device.type != "cuda"):
            extra["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(H // G, dim=-3), v.repeat_interleave(H // G, dim=-3)  # (…, H, S, D)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, **extra)
    return o.transpose(-3, -2).unflatten(0, lead) if len(lead) > 1 else o.transpose(-3, -2)  # (…, T, H, D)


def band_mask(n_queries: int, n_keys: int, prefix: int, window: int, device) -> Tensor:
    """`(n_queries, n_keys)` bool: query r, at key index `prefix + r`, sees keys `prefix + r − w < j ≤ prefix + r`."""
    r = prefix + torch.arange(n_queries, device=device)[:, None]  # (n_queries, 1)
    j = torch.arange(n_keys, device=device)[None, :]  # (1, n_keys)
    return (j <= r) & (j > r - window)


def window_attention_blocked(
    q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float, block_size: int | None = None,
    cu_seqlens: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
) -> Tensor:
    """Same contract as `window_attention_reference`; `block_size` b (a tile of this form, default
    max(window, MIN_BLOCK); raised to the window where smaller)."""
    if cu_seqlens is not None:
        if cu_seqlens_k is None and (window is not None or torch.compiler.is_compiling()):
            return _packed_on_device(q, k, v, window, scale, block_size, device_offsets(cu_seqlens))
        cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
        return _packed(q, k, v, window, scale, block_size, cu_seqlens, cu_k)
    if window is None:
        return _causal(q, k, v, scale)
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    w = window
    prefix = min(S - T, w - 1)  # only the last w − 1 earlier tokens are visible to any query
    k, v = k[:, S - T - prefix :], v[:, S - T - prefix :]  # (B, prefix + T, G, D)
    b = max(w, MIN_BLOCK if block_size is None else block_size)
    if T <= b:  # one block: the band over at most (b, b + w − 1) entries
        if prefix == 0 and T <= w:
            return sdpa_bthd(q, k, v, None, scale, is_causal=True)
        return sdpa_bthd(q, k, v, band_mask(T, prefix + T, prefix, w, q.device), scale)

    n = -(-T // b)  # query blocks
    pad_end = n * b - T
    q = F.pad(q, (0, 0, 0, 0, 0, pad_end)).view(B, n, b, H, D)  # (B, n, b, H, D)

    def blocks(t: Tensor) -> Tensor:  # (B, prefix + T, G, D) → (B, n, 2b, G, D): block n − 1 then block n
        t = F.pad(t, (0, 0, 0, 0, b - prefix, pad_end)).view(B, n + 1, b, G, D)  # (B, n + 1, b, G, D)
        return torch.cat([t[:, :-1], t[:, 1:]], dim=2)  # (B, n, 2b, G, D)

    kb, vb = blocks(k), blocks(v)
    band = band_mask(b, 2 * b, b, w, q.device)  # (b, 2b): local query r sits at local key b + r
    first = band & (torch.arange(2 * b, device=q.device) >= b - prefix)  # front padding is not a key
    o_first = sdpa_bthd(q[:, :1], kb[:, :1], vb[:, :1], first, scale)  # (B, 1, b, H, D)
    o_rest = sdpa_bthd(q[:, 1:], kb[:, 1:], vb[:, 1:], band, scale)  # (B, n − 1, b, H, D)
    o = torch.cat([o_first, o_rest], dim=1).view(B, n * b, H, D)  # (B, n·b, H, D)
    return o[:, :T]


def _causal(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Global causal attention of one sequence per batch row, the last T of S keys being the queries' own."""
    T, S = q.shape[1], k.shape[1]
    if S == T:
        return sdpa_bthd(q, k, v, None, scale, is_causal=True)
    if T == 1 and not torch.compiler.is_compiling():
        # a decode step: its one query sees every key, so no mask (9 ops fewer a layer; on CUDA the flash kernels,
        # which take none). Traced, the mask stays: Inductor (torch 2.13) compiled this maskless graph of a growing
        # cache into a kernel calling an unbound size symbol (tests/models/test_generation_compile.py).
        return sdpa_bthd(q, k, v, None, scale)
    return sdpa_bthd(q, k, v, band_mask(T, S, S - T, S, q.device), scale)  # (T, S) bool: prefix all visible


def _causal_right_padded(q: Tensor, k: Tensor, v: Tensor, scale: float, cu: Tensor, longest: int) -> Tensor:
    """Global attention of packed sequences without prefixes as one batch `(N, longest)`, each sequence
    right-padded: under the causal mask a real query never sees the padding after it, so this is exact. One
    large SDPA call runs faster on the CPU than N small ones (docs/research/speed-and-memory.md), at N·longest² scores."""
    T = q.shape[1]
    t = torch.arange(longest, device=q.device)
    index = (cu[:-1].long()[:, None] + t[None, :]).clamp(max=T - 1)  # (N, longest): padding reads any token
    gather = lambda x: x[0][index]  # noqa: E731  (1, T, ·, D) -> (N, longest, ·, D)
    o = sdpa_bthd(gather(q), gather(k), gather(v), None, scale, is_causal=True)  # (N, longest, H, D)
    seq = sequence_ids(cu, T)  # (T,)
    rows = seq * longest + torch.arange(T, device=q.device) - cu.long()[seq]  # (T,): each token's padded row
    # the real rows, in packed order: an index of known length, not a mask (whose shape needs a host sync)
    return o.flatten(0, 1)[rows].unsqueeze(0)  # (1, T, H, D)


def _packed_on_device(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float, block_size: int | None,
                      cu_q: Tensor) -> Tensor:
    """Packed sequences without prefixes (the training case): the band over the stream itself, the offsets
    read on the device only, so nothing syncs and `torch.compile` traces it whole whatever the packing. Global
    attention here takes the whole stream as its window (O(T²) scores: only under `torch.compile`; eager
    `_packed` bounds it by the longest sequence)."""
    T = q.shape[1]
    w = T if window is None else window
    b = max(w, MIN_BLOCK if block_size is None else block_size)
    return _band_same_sequence(q, k, v, sequence_ids(cu_q, T), w, scale, b)  # (1, T, H, D)


def _packed(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float, block_size: int | None,
            cu_q: Tensor, cu_k: Tensor) -> Tensor:
    """Packed sequences (B = 1): the band over the stream of each sequence's visible keys (module docstring)."""
    off_q, off_k = host_offsets(cu_q), host_offsets(cu_k)  # no read back when the offsets come checked
    cu_q, cu_k = device_offsets(cu_q), device_offsets(cu_k)
    if len(off_q) == 2:  # one sequence: the unpacked form
        return window_attention_blocked(q, k, v, window, scale, block_size)
    if window is None:
        len_q = [b - a for a, b in zip(off_q, off_q[1:])]
        len_k = [b - a for a, b in zip(off_k, off_k[1:])]
        if len_q == len_k:  # no prefixes: one batched causal SDPA over the sequences, right-padded
            return _causal_right_padded(q, k, v, scale, cu_q, max(len_q))
        if len(off_q) <= MAX_CAUSAL_CALLS + 1:  # prefixes: SDPA's causal kernel per sequence
            # split, not slices: the backward of N slices would zero-fill N full-size gradients; split's is one cat
            parts = zip(q.split(len_q, dim=1), k.split(len_k, dim=1), v.split(len_k, dim=1))
            return torch.cat([_causal(qn, kn, vn, scale) for qn, kn, vn in parts], dim=1)  # (1, Tq, H, D)
    len_q = [b - a for a, b in zip(off_q, off_q[1:])]
    len_k = [b - a for a, b in zip(off_k, off_k[1:])]
    w = max(len_k) if window is None else window  # global: a window no sequence outgrows
    keep = [min(lk - lq, w - 1) + lq for lq, lk in zip(len_q, len_k)]  # visible prefix + own keys
    Tq, L, dev = q.shape[1], sum(keep), q.device
    cu_q, cu_k = cu_q.long(), cu_k.long()
    keep_t = on_device(keep, dev)  # (N,)
    cu_s = F.pad(keep_t.cumsum(0), (1, 0))  # (N + 1,) offsets of the key stream
    seq_s = sequence_ids(cu_s, L)  # (L,) sequence of each stream slot
    if keep != len_k:  # drop the prefix keys no query can see
        src = cu_k[1:][seq_s] - keep_t[seq_s] + torch.arange(L, device=dev) - cu_s[seq_s]  # (L,) key index
        k, v = k.index_select(1, src), v.index_select(1, src)  # (1, L, G, D)
    dst = None
    if L != Tq:  # prefix slots in the stream: queries go to their own key's slot
        dst = torch.arange(Tq, device=dev) + (cu_s[1:] - cu_q[1:])[sequence_ids(cu_q, Tq)]  # (Tq,)
        q = q.new_zeros(1, L, *q.shape[2:]).index_copy(1, dst, q)  # (1, L, H, D)
    b = max(w, MIN_BLOCK if block_size is None else block_size)
    o = _band_same_sequence(q, k, v, seq_s, w, scale, b)  # (1, L, H, D)
    return o if dst is None else o.index_select(1, dst)  # (1, Tq, H, D)


def _band_same_sequence(q: Tensor, k: Tensor, v: Tensor, seq: Tensor, w: int, scale: float, b: int) -> Tensor:
    """Sliding-window attention over one stream (B = 1) in which slot j holds query j's own key, restricted
    to keys of the same sequence (`seq` `(L,)`). Every row sees at least itself: no row is fully masked."""
    L, H, D = q.shape[1:]
    G = k.shape[2]
    if L <= b:  # one block
        mask = band_mask(L, L, 0, w, q.device) & (seq[:, None] == seq[None, :])  # (L, L)
        return sdpa_bthd(q, k, v, mask, scale)
    n = -(-L // b)  # query blocks
    pad_end = n * b - L
    qb = F.pad(q[0], (0, 0, 0, 0, 0, pad_end)).view(n, b, H, D)  # (n, b, H, D)

    def blocks(t: Tensor) -> Tensor:  # (1, L, G, D) → (n, 2b, G, D): block n − 1 then block n
        t = F.pad(t[0], (0, 0, 0, 0, b, pad_end)).view(n + 1, b, G, D)  # (n + 1, b, G, D)
        return torch.cat([t[:-1], t[1:]], dim=1)  # (n, 2b, G, D)

    # padding (front: block −1; end: after the last token) is sequence −1; an end-padding query sees itself
    ids = F.pad(seq, (b, pad_end), value=-1).view(n + 1, b)  # (n + 1, b)
    same = ids[1:, :, None] == torch.cat([ids[:-1], ids[1:]], dim=1)[:, None, :]  # (n, b, 2b)
    mask = band_mask(b, 2 * b, b, w, q.device) & same  # (n, b, 2b): local query r at local key b + r
    o = sdpa_bthd(qb, blocks(k), blocks(v), mask[:, None], scale)  # (n, b, H, D)
    return o.reshape(1, n * b, H, D)[:, :L]
