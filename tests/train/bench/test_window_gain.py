"""hybrid.train.bench.window_gain: document blocks, window buckets, bpb per bucket against a float64 reference
computed one sequence at a time, the gain share, and the report section from crafted records."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench.window_gain import (bucket_bpb, document_blocks, gain_section, gain_share, window_edges,
                                            window_metrics)
from hybrid.train.data import PreparedData
from hybrid.train.data.tokenizer import ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)

EOS = ByteTokenizer().eos_id


def stream_with_documents(lengths, seed=0) -> np.ndarray:
    """``[eos] doc₁ [eos] doc₂ …`` with documents of the given lengths, random bytes."""
    rng = np.random.default_rng(seed)
    parts = []
    for n in lengths:
        parts += [EOS, *rng.integers(0, 256, n)]
    return np.asarray(parts, dtype=np.uint16)


def test_document_blocks_hold_no_document_start_after_their_first_token():
    stream = stream_with_documents([5, 40, 3, 29, 17, 61])
    blocks = document_blocks(stream, eos=EOS, length=8, count=100)
    n_blocks = (len(stream) - 1) // 8
    rows = [stream[i * 8: i * 8 + 9] for i in range(n_blocks)]
    expected = [r for r in rows if EOS not in r[1:]]  # every usable block, in stream order
    assert 0 < len(expected) < n_blocks  # some blocks cross a document start
    assert blocks.tolist() == [r.tolist() for r in expected]
    assert blocks.dtype == torch.int64


def test_document_blocks_spread_evenly_and_refuse_when_none_fit():
    stream = stream_with_documents([200])
    every = document_blocks(stream, eos=EOS, length=10, count=100)  # 20 blocks, the first starts with eos
    picked = document_blocks(stream, eos=EOS, length=10, count=5)
    assert every.shape == (20, 11) and picked.shape == (5, 11)
    assert [row.tolist() for row in picked] == [every[i].tolist() for i in (0, 5, 10, 14, 19)]
    with pytest.raises(ValueError, match="length: no stretch of 10 tokens"):
        document_blocks(stream_with_documents([4, 4, 4, 4, 4, 4]), eos=EOS, length=10, count=3)
    with pytest.raises(ValueError, match="length: expected at most 30 tokens per block, got 64"):
        document_blocks(stream_with_documents([30]), eos=EOS, length=64, count=3)


def test_window_edges_double_from_the_window():
    assert window_edges(64, 1024) == [0, 16, 32, 64, 128, 256, 512, 1024]
    assert window_edges(8, 32) == [0, 2, 4, 8, 16, 32]
    assert window_edges(32, 100) == [0, 8, 16, 32, 64, 100]  # the last bucket stops at the length
    assert window_edges(2, 4) == [0, 1, 2, 4]
    assert window_edges(1, 2) == [0, 1, 2]  # no quarter of one token
    assert window_edges(7, 8) == [0, 1, 3, 7, 8]


@pytest.mark.parametrize("window, seq_len", [(8, 3), (8, 8), (32, 16), (0, 16)])
def test_window_edges_refuse_a_window_that_is_not_shorter_than_the_length(window, seq_len):
    """A window of L or more has nothing past it: the edges were [0, 2, 4, 3] at window 8, L 3 (issue: a NaN
    bucket, a "windowed" model that is global)."""
    with pytest.raises(ValueError, match=f"window: expected 1 … {seq_len - 1} tokens .*got {window}"):
        window_edges(window, seq_len)


def test_bucket_bpb_against_float64_losses_one_sequence_at_a_time(direct_losses):
    stream = stream_with_documents([70, 90, 55], seed=1)
    data = PreparedData(train=stream, valid=stream, tokenizer=ByteTokenizer(), stats={"valid_bytes": 215})
    torch.manual_seed(0)
    model = HybridLM(HybridConfig(vocab_size=264, d_model=12, n_heads=2, n_layers=2, pattern="RA", window=4,
                                  init_std=0.5)).eval()
    out = window_metrics(model, data, window=4, seq_len=16, count=7)
    seqs = document_blocks(stream, eos=EOS, length=16, count=7)
    assert out["window_edges"] == [0, 1, 2, 4, 8, 16] and out["window_blocks"] == seqs.shape[0] == 7
    losses = direct_losses(model, seqs)  # (7, 16), float64
    nbytes = (seqs[:, 1:] < 256).double()  # no eos after a block's first token: one byte per target
    assert nbytes.all()
    for (a, b), got in zip(zip(out["window_edges"][:-1], out["window_edges"][1:]), out["window_bpb"]):
        assert got == pytest.approx(losses[:, a:b].sum().item() / math.log(2) / nbytes[:, a:b].sum().item(), rel=1e-6)
    assert bucket_bpb(model, data, seqs, [0, 16], batch_size=3) == pytest.approx(
        [losses.sum().item() / math.log(2) / nbytes.sum().item()], rel=1e-6)


def test_gain_share():
    assert gain_share(2.0, windowed=2.0, global_=1.5) == 0.0
    assert gain_share(1.5, windowed=2.0, global_=1.5) == 1.0
    assert gain_share(1.875, windowed=2.0, global_=1.5) == pytest.approx(0.25)
    assert gain_share(1.4, windowed=2.0, global_=1.5) == pytest.approx(1.2)  # better than the global model
    assert gain_share(1.9, windowed=2.0, global_=1.5, spread=0.5) is None  # the gain is within the spread
    assert gain_share(1.9, windowed=2.0, global_=2.1) is None  # no gain to recover
    assert gain_share(1.9, windowed=2.0, global_=1.5, spread=float("nan")) is None  # unknown spread


def _record(model, seed, bpb):
    return {"model": model, "seed": seed, "config": {"budget": {"extra": {"window": 4}}, "train": {"seq_len": 16}},
            "metrics": {"window_edges": [0, 2, 4, 8, 16], "window_bpb": bpb, "window_blocks": 9}}


def test_gain_section_from_crafted_records(tmp_path):
    records = {
        "transformer": [_record("transformer", 0, [3.0, 2.0, 1.0, 0.9]), _record("transformer", 1, [3.0, 2.0, 1.0, 1.1])],
        "transformer-window": [_record("transformer-window", s, [3.0, 2.0, 2.0, 2.0]) for s in (0, 1)],
        "hybrid": [_record("hybrid", 0, [3.0, 2.0, 1.5, 1.5]), _record("hybrid", 1, [3.0, 2.0, 2.0, 1.0])],
    }
    text = "\n".join(gain_section(records, tmp_path))
    assert "9 validation blocks of 16 tokens" in text
    # gains per bucket: 0, 0, 1.0 (spread 0: above), 1.0 (transformer's std 0.141: twice 0.283, above)
    assert "| gain | +0.000 (not above 0.000) | +0.000 (not above 0.000) | +1.000 (above 0.000) | +1.000 (above 0.283) |" in text
    assert "Past the window the gain is above twice the spread in 2 of 2 buckets" in text
    # hybrid's shares per seed: [4, 8): 0.5 and 0.0; [8, 16): 0.5 and 1.0 (the means of the reference models)
    assert "| hybrid | – | – | 0.25 ± 0.35 | 0.75 ± 0.35 |" in text
    assert (tmp_path / "bpb_by_context.png").is_file()
    assert gain_section({"transformer": [{"model": "transformer", "metrics": {}, "config": {}}]}) == []


def test_the_plot_reads_context_length_inside_the_block(tmp_path, monkeypatch):
    """Most blocks start mid-document: the x axis is the context inside the block, not a position in the
    document."""
    import hybrid.train.bench.window_gain as window_gain

    seen = {}
    monkeypatch.setattr(window_gain, "plot_lines", lambda path, series, **kw: seen.update(kw))
    records = {m: [_record(m, 0, [3.0, 2.0, 1.5, 1.0])] for m in ("transformer", "transformer-window")}
    gain_section(records, tmp_path)
    assert seen["xlabel"] == "context length inside the block (tokens)"


def test_gain_section_with_one_seed_shows_shares_in_parentheses():
    records = {m: [_record(m, 0, bpb)] for m, bpb in (("transformer", [3, 2, 1, 1]), ("transformer-window", [3, 2, 2, 2]),
                                                     ("hybrid", [3, 2, 1.5, 1.75]))}
    text = "\n".join(gain_section(records))
    assert "+1.000 (one seed: no spread)" in text
    assert "Past the window the gain is positive in 2 of 2 buckets (one seed: no spread to hold it against)" in text
    assert "| hybrid | – | – | (0.50) | (0.25) |" in text  # no gain inside the window: nothing to share


def _net_records():
    """The global model 0.5 bpb behind the windowed one inside the window and less behind past it: a negative gain,
    a positive one net of the gap in [2, 4), the last bucket inside the window of 4."""
    return {
        "transformer": [_record("transformer", 0, [3.5, 2.5, 2.3, 2.2]),
                        _record("transformer", 1, [3.5, 2.6, 2.42, 2.3])],
        "transformer-window": [_record("transformer-window", s, [3.0, 2.0, 2.0, 2.0]) for s in (0, 1)],
        "hybrid": [_record("hybrid", 0, [3.2, 2.2, 2.1, 2.05]), _record("hybrid", 1, [3.2, 2.2, 2.0, 1.95])],
    }


def test_gain_section_net_of_the_gap_inside_the_window():
    records = _net_records()
    text = "\n".join(gain_section(records))
    raw, net = text.split("### Net of the gap inside the window (from [2, 4) on)")
    assert ("| gain | -0.500 (not above 0.000) | -0.550 (not above 0.141) | -0.360 (not above 0.170) "
            "| -0.250 (not above 0.141) |") in raw
    assert "| hybrid | – | – | – | – |" in raw
    assert "Past the window the gain is above twice the spread in 0 of 2 buckets" in raw
    # each seed less its own [2, 4): global [-0.2, -0.3] and [-0.18, -0.3]; windowed [0, 0]
    assert "| net gain | +0.190 (above 0.028) | +0.300 (above 0.000) |" in net
    assert "Past the window the gain is above twice the spread in 2 of 2 buckets" in net
    # hybrid's seeds less their own [2, 4): [-0.1, -0.15] and [-0.2, -0.25]; share = (0 − that) / net gain
    shares = [[0.1 / 0.19, 0.2 / 0.19], [0.15 / 0.3, 0.25 / 0.3]]
    cells = [f"{statistics.fmean(v):.2f} ± {statistics.stdev(v):.2f}" for v in shares]
    assert f"| hybrid | {cells[0]} | {cells[1]} |" in net


def test_gain_section_net_with_one_seed():
    records = {m: runs[:1] for m, runs in _net_records().items()}
    net = "\n".join(gain_section(records)).split("### Net of the gap")[1]
    assert "| net gain | +0.200 (one seed: no spread) | +0.300 (one seed: no spread) |" in net
    assert f"| hybrid | ({0.1 / 0.2:.2f}) | ({0.15 / 0.3:.2f}) |" in net
    assert "the gain is positive in 2 of 2 buckets (one seed: no spread to hold it against)" in net
