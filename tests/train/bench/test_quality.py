"""hybrid.train.bench.quality against direct computations on tiny models: long validation sequences, bits per
byte at k × L (full-context and streaming, whole and last window), loss by position."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench.quality import context_metrics, long_sequences, position_edges, token_losses
from hybrid.train.data import PreparedData
from hybrid.train.data.tokenizer import ByteTokenizer

L = 6  # the "training length"

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)

VOCAB = 264


def prepared(n_tokens=200, valid_bytes=150, seed=0) -> PreparedData:
    rng = np.random.default_rng(seed)
    valid = rng.integers(0, 259, n_tokens).astype(np.uint16)
    return PreparedData(train=valid.copy(), valid=valid, tokenizer=ByteTokenizer(),
                        stats={"valid_bytes": valid_bytes})


def model_of(**overrides) -> HybridLM:
    torch.manual_seed(0)
    # init_std 0.5: logits far from uniform, so that every position and mixer shows in the losses
    fields = dict(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=2, pattern="RA", window=4, init_std=0.5)
    config = HybridConfig(**{**fields, **overrides})
    return HybridLM(config).eval()


def test_long_sequences_are_consecutive_blocks_of_the_stream():
    data = prepared()
    seqs = long_sequences(data.valid, length=8 * L, count=3)
    assert seqs.shape == (3, 8 * L + 1)
    for i in range(3):
        assert seqs[i].tolist() == data.valid[i * 8 * L: (i + 1) * 8 * L + 1].tolist()
    with pytest.raises(ValueError, match="count: the validation stream .* holds 4 sequences of 48 tokens, expected at least 5"):
        long_sequences(data.valid, length=8 * L, count=5)


def test_position_edges():
    assert position_edges(8, 4) == [0, 2, 4, 6, 8, 16, 24, 32]
    assert position_edges(2, 2) == [0, 1, 2, 4]  # quarters collapse at tiny lengths


def test_bpb_is_mean_loss_over_ln2_per_byte_and_streaming_equals_full_context(direct_losses):
    data = prepared()
    model = model_of()
    seqs = long_sequences(data.valid, length=8 * L, count=3)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(1, 2, 4, 8), batch_size=2)
    bytes_per_token = 150 / 199
    for k in (1, 2, 4, 8):
        losses = direct_losses(model, seqs[:, :k * L + 1])  # (3, kL)
        whole = losses.mean().item() / math.log(2) / bytes_per_token
        last = losses[:, (k - 1) * L:].mean().item() / math.log(2) / bytes_per_token
        assert m[f"bpb_full_{k}x"] == pytest.approx(whole, rel=1e-6)
        assert m[f"bpb_full_{k}x_last"] == pytest.approx(last, rel=1e-6)
        # no position limit, nothing length-dependent: streaming in chunks of L is the same model
        assert m[f"bpb_stream_{k}x"] == pytest.approx(whole, rel=1e-5)
        assert m[f"bpb_stream_{k}x_last"] == pytest.approx(last, rel=1e-5)
    losses = direct_losses(model, seqs)
    edges = m["position_edges"]
    assert edges == position_edges(L, 8)
    for (a, b), got in zip(zip(edges[:-1], edges[1:]), m["position_bpb"]):
        assert got == pytest.approx(losses[:, a:b].mean().item() / math.log(2) / bytes_per_token, rel=1e-6)


def test_streaming_differs_where_the_frequencies_follow_the_length():
    """Dynamic NTK rescales with the length processed so far: chunk by chunk is not one long forward."""
    data = prepared()
    scaling = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}
    model = model_of(rope_scaling=scaling, pattern="A", window=None, rope_placement="qk")
    seqs = long_sequences(data.valid, length=4 * L, count=2)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(4,))
    assert abs(m["bpb_stream_4x"] - m["bpb_full_4x"]) > 1e-4 * m["bpb_full_4x"]
    stream = token_losses(model, seqs, mode="chunked", chunk_size=L)
    assert m["bpb_stream_4x"] == pytest.approx(data.bpb(stream.mean().item()), rel=1e-9)


def test_learned_positions_have_no_figures_past_their_table(direct_losses):
    data = prepared()
    model = model_of(abs_pos="learned", abs_pos_max_len=2 * L)
    seqs = long_sequences(data.valid, length=4 * L, count=2)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(1, 2, 4))
    assert m["bpb_full_2x"] is not None and m["bpb_stream_2x"] is not None
    assert m["bpb_full_4x"] is None and m["bpb_stream_4x_last"] is None and m["position_bpb"] is None
    losses = direct_losses(model, seqs[:, :2 * L + 1])
    assert m["bpb_stream_2x"] == pytest.approx(data.bpb(losses.mean().item()), rel=1e-5)
