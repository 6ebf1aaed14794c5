"""hybrid.train.bench.quality against direct computations on tiny models: long validation sequences, bits per
byte at k × L (full-context and streaming, whole and last window), loss by position. Each figure is checked
against float64 losses over the bytes of its own targets (a byte for ids < 256, none for the specials)."""
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


def own_bpb(losses: torch.Tensor, seqs: torch.Tensor) -> float:
    """Σ loss / ln 2 / Σ bytes of the targets of ``seqs`` that ``losses`` ``(N, T')`` score (the first T' of each):
    a byte for each id below 256, none for ``<bos>``, ``<eos>``, ``<pad>``."""
    nbytes = (seqs[:, 1:1 + losses.shape[1]] < 256).sum().item()
    return losses.double().sum().item() / math.log(2) / nbytes


def test_bpb_is_each_slices_loss_over_its_own_bytes_and_streaming_equals_full_context(direct_losses):
    data = prepared()
    model = model_of()
    seqs = long_sequences(data.valid, length=8 * L, count=3)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(1, 2, 4, 8), batch_size=2)
    for k in (1, 2, 4, 8):
        losses = direct_losses(model, seqs[:, :k * L + 1])  # (3, kL)
        whole = own_bpb(losses, seqs)
        last = own_bpb(losses[:, (k - 1) * L:], seqs[:, (k - 1) * L:])
        assert m[f"bpb_full_{k}x"] == pytest.approx(whole, rel=1e-6)
        assert m[f"bpb_full_{k}x_last"] == pytest.approx(last, rel=1e-6)
        assert m[f"loss_full_{k}x"] == pytest.approx(losses.mean().item(), rel=1e-6)
        # no position limit, nothing length-dependent: streaming in chunks of L is the same model
        assert m[f"bpb_stream_{k}x"] == pytest.approx(whole, rel=1e-5)
        assert m[f"bpb_stream_{k}x_last"] == pytest.approx(last, rel=1e-5)
    losses = direct_losses(model, seqs)
    edges = m["position_edges"]
    assert edges == position_edges(L, 8)
    split_wide = []
    for (a, b), got in zip(zip(edges[:-1], edges[1:]), m["position_bpb"]):
        assert got == pytest.approx(own_bpb(losses[:, a:b], seqs[:, a:]), rel=1e-6)
        split_wide.append(data.bpb(losses[:, a:b].mean().item()))
    # the split's bytes per target is not a bucket's: the old conversion is off here by several per cent
    assert max(abs(s / g - 1) for s, g in zip(split_wide, m["position_bpb"])) > 0.02


def test_a_slice_of_specials_alone_has_no_bpb():
    """Targets that stand for no bytes have no bits per byte (None), not a division by zero or a NaN."""
    data = prepared()
    data.valid[:2 * L + 1] = ByteTokenizer.eos_id  # the first sequence's first 2L targets: eos only
    model = model_of()
    seqs = long_sequences(data.valid, length=4 * L, count=1)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(1, 2, 4))
    assert m["bpb_full_1x"] is None and m["bpb_full_2x_last"] is None and m["position_bpb"][0] is None
    assert m["bpb_full_4x"] is not None and m["loss_full_1x"] is not None


def test_streaming_differs_where_the_frequencies_follow_the_length():
    """Dynamic NTK rescales with the length processed so far: chunk by chunk is not one long forward."""
    data = prepared()
    scaling = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}
    model = model_of(rope_scaling=scaling, pattern="A", window=None, rope_placement="qk")
    seqs = long_sequences(data.valid, length=4 * L, count=2)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(4,))
    assert abs(m["bpb_stream_4x"] - m["bpb_full_4x"]) > 1e-4 * m["bpb_full_4x"]
    stream = token_losses(model, seqs, mode="chunked", chunk_size=L)
    assert m["bpb_stream_4x"] == pytest.approx(own_bpb(stream, seqs), rel=1e-9)


def test_learned_positions_have_no_figures_past_their_table(direct_losses):
    data = prepared()
    model = model_of(abs_pos="learned", abs_pos_max_len=2 * L)
    seqs = long_sequences(data.valid, length=4 * L, count=2)
    m = context_metrics(model, data, seqs, seq_len=L, factors=(1, 2, 4))
    assert m["bpb_full_2x"] is not None and m["bpb_stream_2x"] is not None
    assert m["bpb_full_4x"] is None and m["bpb_stream_4x_last"] is None and m["position_bpb"] is None
    losses = direct_losses(model, seqs[:, :2 * L + 1])
    assert m["bpb_stream_2x"] == pytest.approx(own_bpb(losses, seqs), rel=1e-5)
    assert m["loss_full_4x"] is None
