"""The loop's pending record (``hybrid.train.loop.loop.PendingRecord``): what the next training record averages,
saved with a checkpoint taken between two records, back on each rank as it was, or on another number of ranks with
the same means."""
import torch

from hybrid.train.loop.loop import PendingRecord


class FakeEnv:
    """One rank of ``world_size`` whose collectives see only its own contribution (the others add zeros to the
    table ``state_dict`` gathers)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, tensor):
        return tensor


def _pending(rank, world_size, losses=()):
    pending = PendingRecord(FakeEnv(rank, world_size), torch.device("cpu"))
    for loss in losses:
        pending.add({"loss": torch.tensor(loss, dtype=torch.float32), "aux": torch.tensor(1.0)}, 128)
    pending.add(None, 128)  # a skipped step
    pending.seconds = 0.5
    return pending


def test_the_state_holds_every_ranks_sums_and_the_counts():
    state = _pending(1, 2, [0.1, 0.2]).state_dict()
    loss = float(torch.tensor(0.1, dtype=torch.float32).double() + torch.tensor(0.2, dtype=torch.float32).double())
    assert state == {"sums": {"loss": [0.0, loss], "aux": [0.0, 2.0]}, "steps": 3, "skipped": 1, "tokens": 384,
                     "seconds": 0.5}


def test_the_same_ranks_get_their_own_sums_back_bit_for_bit():
    saved = _pending(1, 2, [0.1, 0.2])
    back = PendingRecord(FakeEnv(1, 2), torch.device("cpu"))
    back.load_state_dict(saved.state_dict())
    assert {k: v.item() for k, v in back.sums.items()} == {k: v.item() for k, v in saved.sums.items()}
    assert (back.steps, back.skipped, back.tokens, back.seconds) == (3, 1, 384, 0.5)


def test_another_number_of_ranks_keeps_the_means():
    """The record's mean is sum over ranks / (kept steps × ranks): rank 0 holds the total scaled to the new count."""
    state = {"sums": {"loss": [3.0, 5.0]}, "steps": 2, "skipped": 0, "tokens": 0, "seconds": 0.0}
    for world_size, expected in ((1, 4.0), (4, 16.0)):
        first, other = (PendingRecord(FakeEnv(r, world_size), torch.device("cpu")) for r in (0, world_size - 1))
        first.load_state_dict(state)
        other.load_state_dict(state)
        assert first.sums["loss"].item() == expected
        assert other.sums["loss"].item() == (0.0 if world_size > 1 else expected)
        assert first.sums["loss"].item() / world_size == (3.0 + 5.0) / 2  # the same mean per step
