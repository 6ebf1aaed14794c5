r"""The chunkwise form of vo_gla in torch: the fast form for whole and packed sequences on any device.

Each sequence is cut into chunks of C = ``tile_size`` tokens that start at its first token (fla's chunk grid for
packed sequences: no chunk holds two sequences, so nothing inside a chunk is masked by sequence). In a chunk whose
first token is t₀, with ``S`` the state entering it (in the frame of token t₀ − 1), everything is chunk-local:

    b_c = Σ_{t₀≤s≤c} log γ_s        φ_c = Σ_{t₀≤s≤c} θ_s          (log-decays and angles summed within the chunk)
    ṽ_m = e^{iφ_m} v_m              (values turned into the frame of token t₀ − 1)
    o_c = e^{−iφ_c} [ Σ_{m≤c} e^{b_c − b_m} (q_c·k_m) ṽ_m  +  e^{b_c} q_c S ]
    S'  = e^{−iφ_e} [ e^{b_e} S + Σ_m e^{b_e − b_m} k_m ⊗ ṽ_m ]        (e: the chunk's last token)

so the bracket is simple GLA on the turned values, and the chunk's total rotation ``φ_e`` is carried into the state:
every angle is a sum of at most C increments, never the sequence's whole phase, and keeps float32's precision at
any length. Static angles (one θ per pair for every token, the VO-RoPE frequencies) make ``φ_c = (c − t₀ + 1)·θ``
the same in every chunk: one ``(C, H, P)`` table of cosines and sines, and ``φ_e`` from each chunk's token count,
instead of a cumulative sum and two transcendentals per token. Every exponent is ≤ 0 (masked entries are −∞
before the exponential), so nothing overflows.

The carry across chunks is a loop over chunks that restarts the state at each sequence's first chunk (the given
initial state, or zeros). Memory: ``(B, n_chunks, H, C, C)`` scores and ``(B, n_chunks, H, Dk, Dv)`` states:
O(T·C + T/C·Dk·Dv), never ``(T, T)``. Computed in the state dtype (float32; float64 for float64 inputs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .rotation import rotate


def chunk_layout(cu: Tensor, T: int, C: int, bounds: tuple[int, ...] | None = None):
    """The chunk grid of the sequences ``cu`` ``(N+1,)`` over T tokens.

    Returns ``index`` ``(NC, C)`` (the token at each slot; 0 where the slot is past its chunk's sequence),
    ``valid`` ``(NC, C)``, ``inverse`` ``(T,)`` (the flat slot of each token) and three lists of NC entries on the
    host: each chunk's sequence, whether it is its sequence's first chunk, whether its last. ``bounds``: the same
    offsets on the host (a ``PackedOffsets``'s), from which the lists come without reading ``cu`` back (a sync on
    a GPU); without them the lists are read back once."""
    cu = cu.long()
    device = cu.device
    N = cu.numel() - 1
    lengths = cu[1:] - cu[:-1]  # (N,)
    per_seq = torch.div(lengths + C - 1, C, rounding_mode="floor")  # (N,): chunks of each sequence
    first_chunk = torch.cumsum(per_seq, 0) - per_seq  # (N,): the index of each sequence's first chunk
    host_lists = None if bounds is None else _host_chunk_lists(bounds, C)
    chunk_seq = torch.repeat_interleave(torch.arange(N, device=device), per_seq,
                                        output_size=None if host_lists is None else len(host_lists[0]))  # (NC,)
    j = torch.arange(chunk_seq.numel(), device=device) - first_chunk[chunk_seq]  # (NC,): chunk within its sequence
    start = cu[chunk_seq] + j * C  # (NC,)
    slot = torch.arange(C, device=device)
    pos = start[:, None] + slot  # (NC, C)
    valid = pos < cu[chunk_seq + 1][:, None]
    index = torch.where(valid, pos, 0)
    t = torch.arange(T, device=device)
    seq_t = torch.searchsorted(cu[1:].contiguous(), t, right=True)  # (T,)
    off = t - cu[seq_t]
    inverse = (first_chunk[seq_t] + torch.div(off, C, rounding_mode="floor")) * C + off % C  # (T,)
    if host_lists is None:
        flags = torch.stack([chunk_seq, (j == 0).long(), (j == per_seq[chunk_seq] - 1).long()]).tolist()
        host_lists = flags[0], [bool(f) for f in flags[1]], [bool(f) for f in flags[2]]
    return (index, valid, inverse) + host_lists


def _host_chunk_lists(bounds: tuple[int, ...], C: int) -> tuple[list[int], list[bool], list[bool]]:
    """``chunk_layout``'s three host lists from the offsets on the host: each chunk's sequence, first, last."""
    chunk_seq, first, last = [], [], []
    for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
        count = -(-(b - a) // C)
        chunk_seq += [n] * count
        first += [True] + [False] * (count - 1)
        last += [False] * (count - 1) + [True]
    return chunk_seq, first, last


def _gather(x: Tensor, index: Tensor, valid: Tensor) -> Tensor:
    """``x`` ``(B, T, …)`` -> ``(B, NC, C, …)`` in chunk slots, zeros in the slots past a sequence's end."""
    out = x[:, index]  # (B, NC, C, …)
    mask = valid.view(1, *valid.shape, *([1] * (x.dim() - 2)))
    return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))


def _static_turns(th: Tensor, counts: Tensor, C: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Chunk-local angles for one θ per pair at every token: ``th`` ``(Bd, 1, H, P)``, ``counts`` ``(NC,)`` the
    tokens of each chunk. Returns cos φ_c and sin φ_c ``(Bd, 1, C, H, P)`` (``φ_c = (c + 1)·θ``, the same in every
    chunk) and cos φ_e, sin φ_e ``(Bd, NC, H, P)`` at each chunk's last token (``φ_e = count·θ``)."""
    slots = torch.arange(1, C + 1, dtype=th.dtype, device=th.device)  # (C,)
    phi = th[:, :, None] * slots[:, None, None]  # (Bd, 1, C, H, P)
    phi_end = th * counts.to(th.dtype)[None, :, None, None]  # (Bd, NC, H, P)
    return torch.cos(phi), torch.sin(phi), torch.cos(phi_end), torch.sin(phi_end)


def vo_gla_chunkwise(q: Tensor, k: Tensor, v: Tensor, g: Tensor, th: Tensor, init: Tensor | None, cu: Tensor,
                     C: int, want_final: bool, bounds: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor | None]:
    """The scheme of the module docstring. q, k ``(B, T, H, Dk)``, v ``(B, T, H, Dv)``, g ``(B, T, H)`` (log γ;
    may be an expanded view), th ``(Bd, Td, H, Dv/2)`` (θ; Bd ∈ {1, B}, Td ∈ {1, T}: Td = 1 is one angle per pair
    at every token), T ≥ 1, all in the state dtype; cu ``(N+1,)`` (the sequences, shared by the B rows); init
    ``(B, N, H, Dk, Dv)`` or None (zeros); bounds: ``cu`` on the host, or None (read back once). Returns o
    ``(B, T, H, Dv)`` and, if want_final, the final states ``(B, N, H, Dk, Dv)``."""
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    C = max(1, min(C, T))
    static = th.shape[1] == 1
    per_token = () if static else (th.expand(B, T, H, Dv // 2),)
    if cu.numel() == 2:  # one sequence per row: the chunks are a zero-padded reshape (no gather, no scatter)
        NC = -(-T // C)
        chunk_seq, first, last, inverse = [0] * NC, [True] + [False] * (NC - 1), [False] * (NC - 1) + [True], None
        qc, kc, vc, gc, *thc = (F.pad(x, (0, 0) * (x.dim() - 2) + (0, NC * C - T)).unflatten(1, (NC, C))
                                for x in (q, k, v, g, *per_token))  # (B, NC, C, …)
        counts = (T - torch.arange(NC, device=q.device) * C).clamp(max=C)  # (NC,)
    else:
        index, valid, inverse, chunk_seq, first, last = chunk_layout(cu, T, C, bounds)
        qc, kc, vc, gc, *thc = (_gather(x, index, valid) for x in (q, k, v, g, *per_token))  # (B, NC, C, …)
        NC = index.shape[0]
        counts = valid.sum(1)  # (NC,)

    # log-decays summed within the chunk, each first clamped where its decay already rounds to 0 (float32: e^−110,
    # float64: e^−750; the same numbers and gradients), so that no sum of finite ones overflows to −∞ (then NaN)
    b = gc.clamp(min=-110.0 if gc.dtype != torch.float64 else -750.0).cumsum(2)  # (B, NC, C, H)
    if static:  # cos φ, sin φ (Bd, 1, C, H, P), shared by the chunks; at φ_e (Bd, NC, H, P)
        cos, sin, cos_end, sin_end = _static_turns(th, counts, C)
    else:
        phi = thc[0].cumsum(2)  # (B, NC, C, H, P): angles summed within the chunk
        cos, sin = torch.cos(phi), torch.sin(phi)
        cos_end, sin_end = cos[:, :, -1], sin[:, :, -1]  # (B, NC, H, P): past the end θ = 0, the last valid token's
    v_turned = rotate(vc, cos, sin)  # (B, NC, C, H, Dv): ṽ_m = e^{iφ_m} v_m

    # intra: Σ_{m<c} e^{b_c − b_m} (q_c·k_m) ṽ_m; the term m = c, (q_c·k_c) v_c, is added unturned below: through
    # the turns and the gap it would be e^{−iφ_c} e^{iφ_c} and e^{b_c − b_c}, whose angle and decay gradients cancel
    # to roundoff of an O(1) term, where the true ones are O(γ) (no correct digit in float32 under strong decay)
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)  # [c, m]: m < c
    gap = b[:, :, :, None] - b[:, :, None, :]  # (B, NC, C, C, H): b_c − b_m
    decay = torch.exp(torch.where(strict[:, :, None], gap, float("-inf")))  # 0 on and above the diagonal
    scores = torch.einsum("bnchd,bnmhd->bnhcm", qc, kc) * decay.permute(0, 1, 4, 2, 3)  # (B, NC, H, C, C)
    o_turned = torch.einsum("bnhcm,bnmhe->bnche", scores, v_turned)  # (B, NC, C, H, Dv)

    # each chunk's own key-value sum and gain, in the frame of its last token
    b_end = b[:, :, -1]  # (B, NC, H) (slots past the end add log γ = 0: the last valid token's sum)
    # the chunk's last token e (the same cancellation as the diagonal): k_e ⊗ v_e added unturned, undecayed
    is_end = torch.arange(C, device=q.device)[None, :] == (counts[:, None] - 1)  # (NC, C)
    k_weight = torch.exp(b_end[:, :, None] - b).masked_fill(is_end[None, :, :, None], 0.0)  # e^{b_e − b_m}, m < e
    kv = torch.einsum("bnmhd,bnmhe->bnhde", kc * k_weight[..., None], v_turned)  # (B, NC, H, Dk, Dv)
    cos_end, sin_end = cos_end[..., None, :], -sin_end[..., None, :]  # e^{−iφ_e} (·, NC, H, 1, P)
    chunks, end = torch.arange(NC, device=q.device), counts - 1  # (NC,): each chunk's last valid slot
    kv = rotate(kv, cos_end, sin_end) + kc[:, chunks, end][..., :, None] * vc[:, chunks, end][..., None, :]
    gain = torch.exp(b_end)[..., None, None]  # (B, NC, H, 1, 1)

    # carry across chunks; None stands for a zero state
    zero = q.new_zeros(B, H, Dk, Dv)
    S, entering, finals = None, [], {}
    # unbind, not [:, n]: n selects' backward would zero-fill n full-size gradients
    for n, (kv_n, gain_n, cos_n, sin_n) in enumerate(zip(kv.unbind(1), gain.unbind(1), cos_end.unbind(1),
                                                        sin_end.unbind(1))):
        if first[n]:
            S = None if init is None else init[:, chunk_seq[n]]
        entering.append(zero if S is None else S)
        S = kv_n if S is None else gain_n * rotate(S, cos_n, sin_n) + kv_n
        if last[n]:
            finals[chunk_seq[n]] = S
    entering = torch.stack(entering, dim=1)  # (B, NC, H, Dk, Dv)
    o_turned = o_turned + torch.einsum("bnchd,bnhde->bnche", qc * torch.exp(b)[..., None], entering)
    o = rotate(o_turned, cos, -sin)  # (B, NC, C, H, Dv): back to each token's own frame
    o = o + (qc * kc).sum(-1, keepdim=True) * vc  # the term m = c, (q_c·k_c) v_c, in its own frame
    o = o.reshape(B, NC * C, H, Dv)  # (B, NC·C, H, Dv)
    o = o[:, :T] if inverse is None else o[:, inverse]  # (B, T, H, Dv)
    final = torch.stack([finals[n] for n in range(len(finals))], dim=1) if want_final else None
    return o, final
