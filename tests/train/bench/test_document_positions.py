"""hybrid.train.bench.document_positions: loss by position over blocks of k × L tokens inside one document each,
against float64 losses over the bytes of each bucket's own targets, and the report's table of it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench.document_positions import document_position_metrics
from hybrid.train.bench.quality import position_edges
from hybrid.train.bench.report import position_table
from hybrid.train.data import PreparedData
from hybrid.train.data.tokenizer import ByteTokenizer

L, FACTOR = 5, 4  # blocks of 20 tokens
EOS = ByteTokenizer.eos_id

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def prepared(valid: np.ndarray) -> PreparedData:
    return PreparedData(train=valid.copy(), valid=valid, tokenizer=ByteTokenizer(),
                        stats={"valid_bytes": int((valid < 256).sum())})


def stream(seed=0) -> np.ndarray:
    """Documents of 7, 45, 3 and 50 tokens (eos at 0, 7, 52, 55): the blocks of 20 at 20, 60 and 80 lie inside one."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 256, n) for n in (6, 44, 2, 49)]
    return np.concatenate([np.concatenate([[EOS], d]) for d in docs]).astype(np.uint16)  # 105 tokens


def model_of(**overrides) -> HybridLM:
    torch.manual_seed(0)
    fields = dict(vocab_size=264, d_model=12, n_heads=2, n_layers=2, pattern="RA", window=3, init_std=0.5)
    return HybridLM(HybridConfig(**{**fields, **overrides})).eval()


def test_buckets_are_each_blocks_own_positions_inside_one_document(direct_losses):
    valid = stream()
    model = model_of()
    m = document_position_metrics(model, prepared(valid), seq_len=L, factor=FACTOR, count=8)
    n = FACTOR * L
    starts = [i * n for i in range((len(valid) - 1) // n) if not (valid[i * n + 1:(i + 1) * n + 1] == EOS).any()]
    assert starts == [20, 60, 80] and m["doc_position_blocks"] == 3  # no eos after a block's first token
    seqs = torch.from_numpy(np.stack([valid[s:s + n + 1] for s in starts]).astype(np.int64))
    losses = direct_losses(model, seqs)  # (3, 20) float64
    edges = position_edges(L, FACTOR)
    assert len(m["doc_position_bpb"]) == len(edges) - 1
    for (a, b), got in zip(zip(edges[:-1], edges[1:]), m["doc_position_bpb"]):
        nbytes = (seqs[:, 1 + a:1 + b] < 256).sum().item()
        assert got == pytest.approx(losses[:, a:b].sum().item() / math.log(2) / nbytes, rel=1e-6)


def test_no_block_inside_a_document_or_past_the_positions_gives_none():
    short_docs = np.tile(np.array([EOS, 1, 2, 3], dtype=np.uint16), 30)  # documents of 4 tokens
    m = document_position_metrics(model_of(), prepared(short_docs), seq_len=L, factor=FACTOR, count=8)
    assert m == {"doc_position_bpb": None, "doc_position_blocks": 0}
    learned = model_of(abs_pos="learned", abs_pos_max_len=2 * L)  # positions stop before 4L
    m = document_position_metrics(learned, prepared(stream()), seq_len=L, factor=FACTOR, count=8)
    assert m == {"doc_position_bpb": None, "doc_position_blocks": 3}


def test_the_report_adds_the_inside_documents_table_where_records_have_it():
    edges = position_edges(L, FACTOR)
    record = lambda doc: {"metrics": {"position_edges": edges, "position_bpb": [2.0] * (len(edges) - 1),  # noqa: E731
                                      "doc_position_bpb": doc, "doc_position_blocks": 3 if doc else 0}}
    old = position_table({"hybrid": [record(None)], "transformer": [record(None)]})
    assert "Loss by position" in old and "Inside documents" not in old
    new = position_table({"hybrid": [record([1.5] * (len(edges) - 1)), record([1.7] * (len(edges) - 1))],
                          "transformer": [record(None)]})
    inside = new[new.index("Inside documents"):]
    assert "3 blocks" in inside and "| hybrid | 1.600 ± 0.141 |" in inside and "| transformer | – |" in inside
