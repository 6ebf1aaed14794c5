"""Block-local sliding-window attention: O(T·w) time and memory on any device, through SDPA.

Queries are cut into blocks of `b ≥ w` tokens. Query block n only sees keys of its own block and of the block
before it (a query's window reaches back w − 1 ≤ b − 1 tokens), so each block attends over 2b keys with one
`(b, 2b)` band mask. The key sequence is padded in front so that the tokens before the queries (at most
w − 1 of them are visible) fill the tail of "block −1"; the padded slots only occur in the first block, which
gets its own mask. No tensor has a T × S dimension: the largest are the `(B, n, 2b, G, D)` key/value blocks
(twice the keys) and SDPA's per-block scores.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# enable_gqa (torch ≥ 2.5) lets SDPA broadcast kv heads without materialising them.
SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
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
    q: Tensor, k: Tensor, v: Tensor, window: int, scale: float, block_size: int | None = None
) -> Tensor:
    """Same contract as `window_attention_reference` (window not None); `block_size` b ≥ window (default
    max(window, MIN_BLOCK))."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    w = window
    prefix = min(S - T, w - 1)  # only the last w − 1 earlier tokens are visible to any query
    k, v = k[:, S - T - prefix :], v[:, S - T - prefix :]  # (B, prefix + T, G, D)
    b = max(w, MIN_BLOCK) if block_size is None else block_size
    if T <= b:  # one block: the band over at most (b, b + w − 1) entries
        if prefix == 0 and T <= w:
            return sdpa_bthd(q, k, v, None, scale, is_causal=T > 1)
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
