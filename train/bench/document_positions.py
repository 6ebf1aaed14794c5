"""Past the training length inside documents: loss by position over blocks of ``factor × L`` tokens that lie in one
document each, so that no file's end is in any target's context.

    m = document_position_metrics(model, data, seq_len=L, factor=8, count=8)
    m["doc_position_bpb"]      # one figure per bucket of position_edges(L, 8), as position_bpb
    m["doc_position_blocks"]   # how many blocks the validation stream held (at most count)

``position_bpb`` (``quality``) reads the first validation blocks as one stream, across the documents' ends, which a
run trained with ``--packing documents`` never saw joined: on the pinned corpus 61 % of its targets past L have
another file in their context (docs/bench/gpu-long/report.md). These blocks are ``window_gain.document_blocks``
(no document starts after a block's first token), so a target at position p is predicted from p + 1 tokens of
its own document: past L, each figure is the model at positions it never trained at, and nothing else.
"""
from __future__ import annotations

from ..data import PreparedData
from .quality import position_edges
from .window_gain import bucket_bpb, document_blocks

__all__ = ["document_position_metrics"]


def document_position_metrics(model, data: PreparedData, *, seq_len: int, factor: int, count: int) -> dict:
    """``doc_position_bpb`` (per bucket of ``position_edges(seq_len, factor)``; None for the whole list where no block
    of ``factor × seq_len`` tokens lies inside one document, or the model's positions stop before) and
    ``doc_position_blocks`` (the blocks read)."""
    length = factor * seq_len
    limit = model.config.max_positions
    try:
        seqs = document_blocks(data.valid, eos=data.tokenizer.eos_id, length=length, count=count)
    except ValueError:  # no document as long as a block
        seqs = None
    if seqs is None or (limit is not None and length > limit):
        return {"doc_position_bpb": None, "doc_position_blocks": 0 if seqs is None else int(seqs.shape[0])}
    edges = position_edges(seq_len, factor)
    return {"doc_position_bpb": bucket_bpb(model, data, seqs, edges), "doc_position_blocks": int(seqs.shape[0])}
