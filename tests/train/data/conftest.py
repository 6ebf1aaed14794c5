"""Fixtures for the data tests."""
import numpy as np
import pytest

from hybrid.train.data.tokenizer import ByteTokenizer


def split_documents(data) -> list[str]:
    """The documents of both splits of byte-level ``PreparedData``, as text, sorted (a token split's two streams
    are one stream cut in two)."""
    tok, out = ByteTokenizer(), []
    streams = (data.train, data.valid) if data.stats["split"] == "documents" else [
        np.concatenate([data.train, data.valid[1:]])]
    for stream in streams:
        cuts = np.flatnonzero(stream == tok.eos_id)
        out += [tok.decode(stream[a + 1:b].tolist()) for a, b in zip(cuts[:-1], cuts[1:])]
    return sorted(out)


@pytest.fixture
def documents_of():
    """``documents_of(data)``: the documents of both splits, as text, sorted (``split_documents``)."""
    return split_documents
