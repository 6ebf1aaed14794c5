"""`shard_sequence`: the layout of every rank's shard, and its refusals (one process; the ranks are simulated)."""
import pytest
import torch

from hybrid.kernels.context_parallel import shard, shard_sequence


def shards(monkeypatch, total, world, cu=None):
    out = []
    for rank in range(world):
        monkeypatch.setattr(shard, "_group_place", lambda group, r=rank: (r, world))
        out.append(shard_sequence(total, "group", cu_seqlens=None if cu is None else torch.tensor(cu)))
    return out


def test_one_sequence_per_row(monkeypatch):
    s = shards(monkeypatch, 21, 3)
    assert [(x.start, x.length) for x in s] == [(0, 7), (7, 7), (14, 7)]
    assert [x.continues for x in s] == [False, True, True]
    assert [x.passes_through() for x in s] == [False, True, True]  # rank 0's transition is never read
    assert s[1].positions().tolist() == list(range(7, 14))
    assert s[2].take(torch.arange(21)[None]).tolist() == [list(range(14, 21))]


def test_packed_documents_across_and_at_the_edges(monkeypatch):
    # documents [0, 6) [6, 8) [8, 14) [14, 15) [15, 21): boundaries before, after and at the edges 7 and 14
    s = shards(monkeypatch, 21, 3, [0, 6, 8, 14, 15, 21])
    assert [x.local_bounds for x in s] == [(0, 6, 7), (0, 1, 7), (0, 1, 7)]
    assert [x.piece_docs for x in s] == [(0, 1), (1, 2), (3, 4)]
    assert [x.piece_offsets for x in s] == [(0, 0), (1, 0), (0, 0)]
    assert [x.continues for x in s] == [False, True, False]
    assert [x.first_piece_length for x in s] == [6, 1, 1]
    assert [x.passes_through() for x in s] == [False, False, False]
    assert s[1].positions().tolist() == [1, 0, 1, 2, 3, 4, 5]
    assert s[1].tokens_before(3) == 1  # one token of its document lies before the shard


def test_a_document_through_a_whole_shard(monkeypatch):
    s = shards(monkeypatch, 21, 3, [0, 2, 19, 21])
    assert [x.passes_through() for x in s] == [False, True, False]  # the middle shard carries the state on
    assert [x.continues for x in s] == [False, True, True]
    assert s[2].piece_offsets == (12, 0) and s[2].tokens_before(100) == 12


def test_refusals(monkeypatch):
    with pytest.raises(ValueError, match=r"^sequence length: expected a multiple of the context-parallel size 3 "
                                         r"\(equal shards; pad the batch to 24 tokens\), got 22$"):
        shards(monkeypatch, 22, 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected offsets ending at total_T=21, got 20$"):
        shards(monkeypatch, 21, 3, [0, 5, 20])
    with pytest.raises(ValueError, match=r"^total: expected a positive int"):
        shard_sequence(0)
    with pytest.raises(ValueError, match=r"^t: expected 12 tokens in dim 1 \(the whole sequence\), got 5$"):
        shard_sequence(12).take(torch.zeros(1, 5))


def test_a_group_without_a_job_is_refused():
    with pytest.raises(ValueError, match=r"^group: expected a process group of an initialised torch.distributed"):
        shard_sequence(8, object())


def test_an_input_that_is_not_this_ranks_shard_is_refused(monkeypatch):
    """The whole sequence passed instead of `shard.take(x)`: refused before any collective (R and G returned
    wrong rows on every rank after the first, silently)."""
    from hybrid import VOGatedLinearAttention, VORecurrence
    from hybrid.kernels.context_parallel import complex_scan_cp

    monkeypatch.setattr(shard, "_group_place", lambda group: (1, 2))
    s = shard_sequence(12, "group")
    with pytest.raises(ValueError, match=r"^x: expected this rank's shard of shape \(B, 6, …\) \(SequenceShard"):
        complex_scan_cp(torch.zeros(2, 12, 2, 4), torch.full((2, 2), -0.1), torch.zeros(2, 2), shard=s)
    for layer in (VORecurrence(16, 2), VOGatedLinearAttention(16, 2)):
        with pytest.raises(ValueError, match=r"^x: expected this rank's shard of shape \(B, 6, …\)"):
            layer(torch.zeros(2, 12, 16), shard=s, output_final_state=False)


def test_offsets_as_a_list_are_refused_and_packed_offsets_taken():
    from hybrid.kernels.varlen import PackedOffsets

    with pytest.raises(ValueError, match=r"^cu_seqlens: expected a LongTensor \(N\+1,\) of sequence offsets, "
                                         r"got list$"):
        shard_sequence(8, cu_seqlens=[0, 3, 8])
    s = shard_sequence(8, cu_seqlens=PackedOffsets.from_bounds([0, 3, 8], device="cpu"))
    assert s.local_bounds == (0, 3, 8) and s.piece_docs == (0, 1)
