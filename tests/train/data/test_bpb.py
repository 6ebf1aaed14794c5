"""hybrid.train.data.bpb: bits per byte from a mean loss, and the unigram baseline by hand."""
import math

import numpy as np
import pytest

from hybrid.train.data import loss_to_bpb, unigram_bpb


def test_loss_to_bpb():
    assert loss_to_bpb(math.log(2), 1.0) == pytest.approx(1.0)
    assert loss_to_bpb(math.log(256), 2.0) == pytest.approx(4.0)


def test_unigram_bpb_matches_a_hand_count():
    train = np.array([9, 0, 0, 1, 1], dtype=np.int64)  # targets 0 0 1 1: p = 0.5 each without smoothing
    valid = np.array([9, 0, 1, 1], dtype=np.int64)
    assert unigram_bpb(train, valid, valid_bytes=3, vocab_size=2, alpha=0.0) == pytest.approx(1.0)
    assert unigram_bpb(train, valid, valid_bytes=6, vocab_size=2, alpha=0.0) == pytest.approx(0.5)
