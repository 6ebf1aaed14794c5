"""The analysis corpus: documents cut into batches of ids, with separators and a BOS prefix."""
import torch

from hybrid.train.rotary_analysis.corpus import token_batches


def test_token_batches_cut_a_stream():
    docs = ["abcdefgh", "ij", "klmnopqrstuvwxyz"]
    batches = list(token_batches(docs, lambda t: [ord(c) for c in t], separator=0, prefix=None, seq_len=5,
                                 batch_size=2, tokens=12))
    assert [b.shape for b in batches] == [torch.Size([2, 5]), torch.Size([1, 5])]
    assert batches[0][0].tolist() == [0, 97, 98, 99, 100]
    with_bos = list(token_batches(docs, lambda t: [ord(c) for c in t], separator=None, prefix=1, seq_len=4,
                                  batch_size=1, tokens=4))
    assert [b.tolist() for b in with_bos] == [[[1, 97, 98, 99]]]
