"""hybrid.train.data.loader: shifted batches, deterministic and resumable epochs, disjoint ranks, evaluation
batches that cover every target once."""
import json

import numpy as np
import pytest
import torch

from hybrid.train.data import BatchLoader, eval_batches


def _stream(n=1000, seed=0):
    return np.random.default_rng(seed).integers(0, 259, size=n).astype(np.uint16)


def test_batches_are_shifted_long_tensors():
    stream = np.arange(1000, dtype=np.uint16)
    x, y = next(BatchLoader(stream, seq_len=17, batch_size=4))
    assert x.shape == y.shape == (4, 17) and x.dtype == y.dtype == torch.long
    for row_x, row_y in zip(x, y):
        start = int(row_x[0])
        assert start % 17 == 0  # a block boundary
        assert torch.equal(row_x, torch.arange(start, start + 17))
        assert torch.equal(row_y, torch.arange(start + 1, start + 18))


def test_loader_is_deterministic_and_resumes_exactly_across_epochs():
    stream = _stream()
    ref = BatchLoader(stream, seq_len=10, batch_size=8, seed=3)
    assert ref.batches_per_epoch == 12
    batches = [next(ref) for _ in range(30)]  # crosses two epoch boundaries
    again = BatchLoader(stream, seq_len=10, batch_size=8, seed=3)
    for b in batches[:7]:
        assert torch.equal(next(again)[0], b[0])
    state = json.loads(json.dumps(again.state_dict()))  # plain values
    resumed = BatchLoader(stream, seq_len=10, batch_size=8, seed=0)
    resumed.load_state_dict(state)
    for b in batches[7:]:
        x, y = next(resumed)
        assert torch.equal(x, b[0]) and torch.equal(y, b[1])
    assert not torch.equal(torch.cat([b[0] for b in batches[:12]]), torch.cat([b[0] for b in batches[12:24]]))
    other_seed = BatchLoader(stream, seq_len=10, batch_size=8, seed=4)
    assert not torch.equal(next(other_seed)[0], batches[0][0])


def test_ranks_see_disjoint_blocks():
    stream = np.arange(1001, dtype=np.int64)  # block i starts at token 10*i: the first input names it
    world = 3
    seen = []
    for rank in range(world):
        loader = BatchLoader(stream, seq_len=10, batch_size=4, seed=1, rank=rank, world_size=world)
        blocks = [int(v) // 10 for _ in range(loader.batches_per_epoch) for v in next(loader)[0][:, 0]]
        seen.append(set(blocks))
        assert len(blocks) == len(set(blocks)) == 32
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])


def test_load_state_dict_refuses_a_different_layout():
    a = BatchLoader(_stream(), seq_len=10, batch_size=8)
    b = BatchLoader(_stream(), seq_len=10, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="fewer than"):
        BatchLoader(_stream(50), seq_len=10, batch_size=8)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_eval_batches_cover_every_target_once(world):
    stream = np.arange(1, 108, dtype=np.int64)  # 106 targets: 10 full blocks of 10 and a tail of 6
    targets = []
    for rank in range(world):
        for x, y in eval_batches(stream, seq_len=10, batch_size=3, rank=rank, world_size=world):
            assert torch.equal(x[:, 1:], y[:, :-1])
            targets += y.flatten().tolist()
    assert sorted(targets) == stream[1:].tolist()
    assert len(list(eval_batches(stream, 10, 3, max_batches=2))) == 2


@pytest.mark.parametrize("limit", [1, 4, 7, 10, 11, 50])
def test_eval_batches_max_sequences_is_one_set_for_every_layout(limit):
    """The first `limit` sequences of the split (the tail counting as the 11th), whatever the batch size and the
    number of ranks (the issue: --eval-batches counted one rank's micro-batches, so the layout changed the set)."""
    stream = np.arange(1, 108, dtype=np.int64)  # 10 full blocks of 10 and a tail of 6
    want = stream[1:1 + min(limit * 10, 106)].tolist()
    for world in (1, 2, 3):
        for batch_size in (1, 2, 3, 5):
            targets = []
            for rank in range(world):
                for _, y in eval_batches(stream, 10, batch_size, rank=rank, world_size=world, max_sequences=limit):
                    assert len(y) <= batch_size
                    targets += y.flatten().tolist()
            assert sorted(targets) == want, (world, batch_size)
