"""Row operations of the fixed-size states (hybrid/batch_state.py's TensorState: R and M) and per-row rotary angles
(Rotary.cos_sin_rows): values row by row, and the one-line errors."""
from __future__ import annotations

import pytest
import torch

from hybrid import MixerState, RecurrenceState, RetentionState
from hybrid.rotary import Rotary


def recurrence_state(B: int, seed: int) -> RecurrenceState:
    g = torch.Generator().manual_seed(seed)
    return RecurrenceState(conv=torch.randn(B, 3, 5, generator=g), scan=torch.randn(B, 2, 4, generator=g))


def test_tensor_states_follow_the_state_api():
    s = recurrence_state(4, 0)
    assert isinstance(s, MixerState) and isinstance(RetentionState(S=torch.zeros(2, 1, 3, 3)), MixerState)
    assert s.clone() is s and s.fork() is s and s.batch_size == 4
    picked = s.select(torch.tensor([2, 0]))
    assert torch.equal(picked.conv, s.conv[[2, 0]]) and torch.equal(picked.scan, s.scan[[2, 0]])
    joined = RecurrenceState.cat([s, picked])
    assert torch.equal(joined.scan, torch.cat([s.scan, s.scan[[2, 0]]]))
    other = recurrence_state(2, 1)
    put = s.put(torch.tensor([3, 1]), other)
    assert torch.equal(put.scan[[3, 1]], other.scan) and torch.equal(put.scan[[0, 2]], s.scan[[0, 2]])
    assert torch.equal(s.scan, recurrence_state(4, 0).scan)  # out of place: the state itself is unchanged
    later = recurrence_state(4, 2)
    back = later.rewind(torch.tensor([True, False, True, False]), s)
    assert torch.equal(back.conv[[0, 2]], later.conv[[0, 2]]) and torch.equal(back.conv[[1, 3]], s.conv[[1, 3]])


@pytest.mark.parametrize("call, match", [
    (lambda s: s.select(torch.tensor([4])), r"^index: expected row indices in \[0, 4\), got \[4\]$"),
    (lambda s: s.select(torch.tensor([[0]])), r"^index: expected a 1-D int64 tensor of row indices, got shape \(1, 1\)"),
    (lambda s: s.put(torch.tensor([0]), recurrence_state(2, 1)), r"^source: expected a RecurrenceState of 1 rows, "
                                                                 r"got 2 rows$"),
    (lambda s: s.rewind(torch.tensor([1, 0, 1, 0]), s), r"^keep: expected a bool tensor of shape \(4,\), got "
                                                        r"int64 of shape \(4,\)$"),
])
def test_row_operation_errors_are_one_line(call, match):
    with pytest.raises(ValueError, match=match):
        call(recurrence_state(4, 0))


@pytest.mark.parametrize("scaling", [None, {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 6},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 6}],
                         ids=["plain", "dynamic", "yarn"])
def test_cos_sin_rows_are_each_rows_own(scaling):
    """Row b gets exactly ``cos_sin(T, offsets[b])``: table rows, or its own frequencies where they depend on the
    length (dynamic NTK past its threshold)."""
    rotary = Rotary(8, scaling=scaling)
    offsets = torch.tensor([0, 3, 11, 40])
    cos, sin = rotary.cos_sin_rows(offsets, 3)
    assert cos.shape == (4, 3, 1, 4)
    for b, o in enumerate(offsets.tolist()):
        want_cos, want_sin = rotary.cos_sin(3, o)
        assert torch.equal(cos[b, :, 0], want_cos) and torch.equal(sin[b, :, 0], want_sin)


@pytest.mark.parametrize("scaling", [
    None, {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 6},
    {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 2.5], "long_factor": [1.0, 3.0, 5.0, 7.0],
     "factor": 4.0, "original_max_position_embeddings": 6}], ids=["plain", "dynamic", "longrope"])
def test_cos_sin_rows_read_nothing_back(scaling):
    """A decode step of a ragged batch reads no position back to the host (a sync per rotary layer on a GPU), even
    where the frequencies follow each row's length (rows below and past L0 = 6 in one batch): the rows trace whole
    (``fullgraph``: reading a tensor's value breaks the graph), and equal each row's ``cos_sin``, at positions past
    any table built so far."""
    rotary = Rotary(10, rotary_dim=8, base=500.0, scaling=scaling)
    rows = torch.compile(rotary.cos_sin_rows, fullgraph=True, backend="eager")
    offsets = torch.tensor([0, 7, 3000, 41, 4])
    cos, sin = rows(offsets, 2)
    for b, o in enumerate(offsets.tolist()):
        want_cos, want_sin = rotary.cos_sin(2, o)
        assert torch.equal(cos[b, :, 0], want_cos) and torch.equal(sin[b, :, 0], want_sin), b


def test_the_layers_of_a_step_share_their_rows_and_no_other_step_does():
    """``cos_sin_rows`` keeps its last answer for the same positions tensor and an equal schedule (the attention
    layers of one decode step): the same tensors, equal to computing them; another schedule, other positions
    or positions changed in place are computed afresh; ``forget_rows`` (a model's every step) drops it, so a
    CUDA graph's replay, which rewrites positions without bumping their version, leaves nothing stale."""
    from hybrid.rotary.module import forget_rows

    forget_rows()
    first, second = Rotary(8, base=500.0), Rotary(8, base=500.0)  # two layers of one model
    offsets = torch.tensor([0, 7, 3000, 41])
    cos, sin = first.cos_sin_rows(offsets, 1)
    assert second.cos_sin_rows(offsets, 1)[0] is cos  # shared
    for b, o in enumerate(offsets.tolist()):
        assert torch.equal(cos[b, :, 0], first.cos_sin(1, o)[0]) and torch.equal(sin[b, :, 0], first.cos_sin(1, o)[1])
    assert Rotary(8, base=100.0).cos_sin_rows(offsets, 1)[0] is not cos  # another schedule
    cos, _ = first.cos_sin_rows(offsets, 1)
    offsets.add_(1)  # in place: its version moves
    moved, _ = first.cos_sin_rows(offsets, 1)
    assert torch.equal(moved[1, 0, 0], first.cos_sin(1, 8)[0][0])
    offsets.data.add_(1)  # as a graph's replay writes it: the version stays
    forget_rows()
    assert torch.equal(first.cos_sin_rows(offsets, 1)[0][1, 0, 0], first.cos_sin(1, 9)[0][0])
