"""Quality beyond the training length: bits per byte at k × L, full-context and streaming, and loss by position.

    seqs = long_sequences(data.valid, length=8 * L, count=8)       # (8, 8L + 1): inputs and targets
    metrics = context_metrics(model, data, seqs, seq_len=L, factors=(2, 4, 8))

The sequences are the first ``count`` blocks of ``8L + 1`` tokens of the validation stream (stride 8L); the
k × L sequences are their first ``kL + 1`` tokens, so every factor scores the same text from the same start.
They are read as one stream, across document ends, with no reset there whatever the run's packing (the
trainer's ``val_bpb`` resets at each end under ``--packing documents``).

- **full-context** (``bpb_full_{k}x``): one parallel forward over each k × L sequence;
- **streaming** (``bpb_stream_{k}x``): the chunked mode, ``L`` tokens at a time, carrying the state across the
  whole 8 × L sequence; the model is causal, so its first kL losses are the k × L streaming losses. For a
  model without a position limit or a length-dependent part the two agree (the modes give the same numbers);
  they part with length-dependent rotary scaling (dynamic NTK, LongRoPE), whose frequencies follow the
  length processed so far;
- ``…_last``: the same over the last training-length window, targets ``(k−1)L … kL − 1``, the tokens that
  see the most context;
- ``loss_full_{k}x``: the full-context mean loss in nats per target (a perplexity per token, ``exp`` of it);
- **loss by position** (``position_bpb`` over ``position_edges``): the full-context 8 × L losses, averaged
  over sequences, in buckets: four inside the first training length, then one per training length.

Bits per byte of a slice are its summed loss (nats) over ln 2 over the UTF-8 bytes of its own target tokens
(``token_bytes.bits_per_byte``; ``eos`` and the other specials hold none, as in the trainer's ``val_bpb``, which
charges the whole split's bytes). A model whose learned absolute positions stop before k × L has no figure there
(None).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..data import PreparedData, num_blocks
from .token_bytes import bits_per_byte, target_bytes

__all__ = ["long_sequences", "token_losses", "position_edges", "context_metrics"]


def long_sequences(stream: np.ndarray, *, length: int, count: int) -> torch.Tensor:
    """The first ``count`` blocks of ``length + 1`` tokens at stride ``length``: ``(count, length + 1)`` int64."""
    available = num_blocks(len(stream), length)
    if available < count:
        raise ValueError(
            f"count: the validation stream ({len(stream):,} tokens) holds {available} sequences of {length} "
            f"tokens, expected at least {count}; use fewer long sequences or more validation data"
        )
    rows = np.asarray(stream)[np.arange(count)[:, None] * length + np.arange(length + 1)]  # (count, length + 1)
    return torch.from_numpy(rows.astype(np.int64))


@torch.no_grad()
def token_losses(model: torch.nn.Module, seqs: torch.Tensor, *, mode: str = "parallel",
                 chunk_size: int | None = None, batch_size: int = 8) -> torch.Tensor:
    """Cross-entropy (nats, float64) of every target: ``seqs`` ``(N, T + 1)`` -> ``(N, T)``."""
    device = model.embed.weight.device
    out = []
    for i in range(0, seqs.shape[0], batch_size):
        batch = seqs[i:i + batch_size].to(device)
        logits, _ = model(batch[:, :-1], mode=mode, chunk_size=chunk_size)
        loss = F.cross_entropy(logits.double().transpose(1, 2), batch[:, 1:], reduction="none")  # (b, T)
        out.append(loss.cpu())
    return torch.cat(out)


def position_edges(seq_len: int, factor: int) -> list[int]:
    """Bucket edges along ``factor × seq_len`` positions: quarters of the first L, then one bucket per L."""
    first = sorted({0, *(seq_len * q // 4 for q in (1, 2, 3)), seq_len})
    return first + [k * seq_len for k in range(2, factor + 1)]


def context_metrics(model: torch.nn.Module, data: PreparedData, seqs: torch.Tensor, *, seq_len: int,
                    factors=(2, 4, 8), batch_size: int = 8) -> dict:
    """Every long-context figure of the module docstring, as a flat dict of floats (None where undefined)."""
    longest = max(factors)
    if seqs.shape[1] < longest * seq_len + 1:
        raise ValueError(f"seqs: expected at least {longest * seq_len + 1} tokens per sequence, got {seqs.shape[1]}")
    limit = model.config.max_positions
    nbytes = target_bytes(data.tokenizer, seqs[:, :longest * seq_len + 1])  # (N, 8L)
    was_training = model.training
    model.eval()
    out: dict = {}
    try:
        fits = lambda k: limit is None or k * seq_len <= limit  # noqa: E731
        stream = None
        if fits(longest):
            stream = token_losses(model, seqs[:, :longest * seq_len + 1], mode="chunked", chunk_size=seq_len,
                                  batch_size=batch_size)  # (N, 8L)
        full_longest = None
        for k in factors:
            n = k * seq_len
            if not fits(k):
                out.update({f"bpb_full_{k}x": None, f"bpb_full_{k}x_last": None,
                            f"bpb_stream_{k}x": None, f"bpb_stream_{k}x_last": None, f"loss_full_{k}x": None})
                continue
            full = token_losses(model, seqs[:, :n + 1], batch_size=batch_size)  # (N, kL)
            if k == longest:
                full_longest = full
            if stream is None:  # the longest streaming pass does not fit, but this shorter one does
                part = token_losses(model, seqs[:, :n + 1], mode="chunked", chunk_size=seq_len, batch_size=batch_size)
            else:
                part = stream[:, :n]
            for name, losses in (("full", full), ("stream", part)):
                out[f"bpb_{name}_{k}x"] = bits_per_byte(losses, nbytes[:, :n])
                out[f"bpb_{name}_{k}x_last"] = bits_per_byte(losses[:, n - seq_len:], nbytes[:, n - seq_len:n])
            out[f"loss_full_{k}x"] = full.mean().item()  # nats per target: a perplexity per token
        edges = position_edges(seq_len, longest)
        out["position_edges"] = edges
        out["position_bpb"] = None if full_longest is None else [
            bits_per_byte(full_longest[:, a:b], nbytes[:, a:b]) for a, b in zip(edges[:-1], edges[1:])]
    finally:
        model.train(was_training)
    return out
