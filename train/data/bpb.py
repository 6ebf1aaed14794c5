"""Bits per byte: a model's validation loss, and the unigram baseline, on the same footing.

Both count every target of the validation stream (`stream[1:]`: the text tokens and each document-ending
`eos`) in the numerator, and only the UTF-8 bytes of the validation documents in the denominator. Ending a
document is information the model must pay for, and it is charged to the text; no bytes are invented for
specials. With the byte tokenizer that is `(bytes + documents)` targets over `bytes` bytes.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["loss_to_bpb", "unigram_bpb", "unigram_bits"]

LN2 = math.log(2.0)


def loss_to_bpb(mean_loss: float, bytes_per_token: float) -> float:
    """Mean cross-entropy in nats per target token → bits per byte of text."""
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token: expected a number > 0, got {bytes_per_token}")
    return float(mean_loss) / LN2 / bytes_per_token


def unigram_bits(train: np.ndarray, valid: np.ndarray, vocab_size: int, alpha: float = 1.0) -> float:
    """Total bits of `valid[1:]` under token frequencies of `train[1:]`, add-`alpha` smoothed over the vocab."""
    counts = np.bincount(np.asarray(train[1:], dtype=np.int64), minlength=vocab_size).astype(np.float64)
    logp = np.log2(counts + alpha) - math.log2(counts.sum() + alpha * vocab_size)
    seen = np.bincount(np.asarray(valid[1:], dtype=np.int64), minlength=vocab_size)
    return float(-(seen * logp).sum())


def unigram_bpb(train: np.ndarray, valid: np.ndarray, valid_bytes: int, vocab_size: int,
                alpha: float = 1.0) -> float:
    """The unigram baseline in bits per byte of validation text."""
    if valid_bytes <= 0:
        raise ValueError(f"valid_bytes: expected a number > 0, got {valid_bytes}")
    return unigram_bits(train, valid, vocab_size, alpha) / valid_bytes
