"""Attention over a ragged batch (hybrid/attention_rows.py, hybrid/attention_state.py, RowKVCache): every row at its
own position gives each row's own outputs, for every cache kind, placement and head layout; the state's row
operations (cat at any positions, select, put, fork / rewind) continue exactly; an older state is refused."""
from __future__ import annotations

import pytest
import torch

from hybrid import Attention, AttentionState
from hybrid.attention_state import is_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D_MODEL = 16
CASES = {
    "global": dict(),
    "window-3": dict(window=3),  # shorter than the rows
    "window-40": dict(window=40),  # longer than the rows
    "gqa-qk-window": dict(n_kv_heads=1, placement="qk", window=5),
    "shared-kv-global": dict(shared_kv=True, placement="qkvo"),
    "vo-window": dict(placement="vo", window=4),
}


def layer_of(options: dict, seed: int = 0, **rotary) -> Attention:
    """A float64 layer with sharp attention (in_proj × 8: the init's attention is near uniform)."""
    from hybrid.rotary import RotaryConfig

    torch.manual_seed(seed)
    layer = Attention(D_MODEL, 2, rotary=RotaryConfig(**rotary) if rotary else None, **options).double().eval()
    with torch.no_grad():
        layer.in_proj.weight.mul_(8.0)
    return layer


def inputs(lengths, extra: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n + extra, D_MODEL, generator=g, dtype=torch.float64) for n in lengths]


def ragged_state(layer, xs, lengths):
    """The per-row states of the first ``lengths[b]`` inputs (a packed forward) joined into one batch."""
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    _, states = layer(torch.cat([x[:n] for x, n in zip(xs, lengths)])[None], cu_seqlens=cu)
    return AttentionState.cat(states), torch.tensor(lengths)


def assert_rows_alone(layer, xs, got, start: int):
    for b, x in enumerate(xs):
        want, _ = layer(x[None])
        err = (got[b] - want[0, start:start + got.shape[1]]).abs().max().item()
        assert err <= 1e-12 * want.abs().max().item(), f"row {b}: max error {err:.3g}"


@pytest.mark.parametrize("name", list(CASES))
def test_ragged_steps_and_chunks_equal_each_row_alone(name):
    layer = layer_of(CASES[name])
    lengths = [1, 6, 2, 9]
    xs = inputs(lengths, 7, seed=1)
    with torch.no_grad():
        state, offset = ragged_state(layer, xs, lengths)
        assert is_rows(state) and state.length.tolist() == [min(n, layer.window or n) for n in lengths]
        outs = []
        for t in range(3):  # decode steps, each row at its own position
            y, state = layer.step(torch.stack([x[n + t] for x, n in zip(xs, lengths)]), state, offset + t)
            outs.append(y[:, None])
        y, state = layer(torch.stack([x[n + 3:n + 7] for x, n in zip(xs, lengths)]), state, offset=offset + 3)
        outs.append(y)  # a chunk of 4 continuing the ragged state
    got = torch.cat(outs, dim=1)  # (B, 7, d)
    for b, (x, n) in enumerate(zip(xs, lengths)):
        want, _ = layer(x[None])
        err = (got[b] - want[0, n:]).abs().max().item()
        assert err <= 1e-12 * want.abs().max().item(), f"{name}, row {b}: max error {err:.3g}"


@pytest.mark.parametrize("rotary", [dict(carope=True), dict(scaling={"rope_type": "dynamic", "factor": 4.0,
                                                                       "original_max_position_embeddings": 5})],
                         ids=["carope", "dynamic-ntk"])
def test_per_row_phases_and_length_dependent_frequencies(rotary):
    """CARoPE's phase is per row in the state; dynamic NTK's frequencies follow each row's own length."""
    layer = layer_of(dict(window=4), seed=2, **rotary)
    lengths = [2, 8, 3]
    xs = inputs(lengths, 4, seed=3)
    with torch.no_grad():
        state, offset = ragged_state(layer, xs, lengths)
        outs = []
        for t in range(4):
            y, state = layer.step(torch.stack([x[n + t] for x, n in zip(xs, lengths)]), state, offset + t)
            outs.append(y)
    got = torch.stack(outs, dim=1)
    for b, (x, n) in enumerate(zip(xs, lengths)):  # the reference decodes the row alone, step by step
        with torch.no_grad():
            _, alone = layer(x[None, :n])
            for t in range(4):
                y, alone = layer.step(x[None, n + t], alone, n + t)
                assert (got[b, t] - y[0]).abs().max().item() <= 1e-12 * y.abs().max().item(), (b, t)


@pytest.mark.parametrize("name", ["global", "window-3"])
def test_select_put_fork_rewind_continue_exactly(name):
    layer = layer_of(CASES[name], seed=4)
    lengths = [3, 7, 1]
    xs = inputs(lengths, 9, seed=5)
    with torch.no_grad():
        state, offset = ragged_state(layer, xs, lengths)
        fork = state.fork()
        chunk = torch.stack([x[n:n + 4] for x, n in zip(xs, lengths)])
        _, after = layer(chunk, state, offset=offset)
        keep = torch.tensor([True, False, False])
        state = after.rewind(keep, fork)  # row 0 keeps its 4 tokens, rows 1 and 2 go back
        offset = torch.where(keep, offset + 4, offset)
        y, state = layer(torch.stack([x[o:o + 2] for x, o in zip(xs, offset.tolist())]), state, offset=offset)
        assert_rows_alone(layer, [xs[0][:9]], y[:1], 7)
        assert_rows_alone(layer, [xs[1][:9]], y[1:2], 7)
        assert_rows_alone(layer, [xs[2][:3]], y[2:], 1)
        offset = offset + 2
        # put: row 1's slot takes a fresh sequence of 5 inputs (its state from a packed forward)
        fresh = torch.randn(8, D_MODEL, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
        _, (one,) = layer(fresh[None, :5], cu_seqlens=torch.tensor([0, 5]))
        state = state.put(torch.tensor([1]), one)
        offset[1] = 5
        picked = state.select(torch.tensor([1, 2]))
        y, _ = layer(torch.stack([fresh[5:7], xs[2][3:5]]), picked, offset=offset[1:])
    assert_rows_alone(layer, [fresh[:7]], y[:1], 5)
    assert_rows_alone(layer, [xs[2][:5]], y[1:], 3)


def test_an_older_state_of_a_rows_cache_is_refused():
    layer = layer_of(CASES["global"])
    xs = inputs([2, 4], 2, seed=7)
    with torch.no_grad():
        state, offset = ragged_state(layer, xs, [2, 4])
        spare = state.clone()
        _, newer = layer.step(torch.stack([xs[0][2], xs[1][4]]), state, offset)
        with pytest.raises(ValueError, match=r"^state: expected the newest state of its cache, got an older one"):
            layer.step(torch.stack([xs[0][2], xs[1][4]]), state, offset)
        y, _ = layer.step(torch.stack([xs[0][2], xs[1][4]]), spare, offset)  # a clone continues
    assert_rows_alone(layer, [xs[0][:3]], y[:1, None], 2)


def test_a_growing_rows_cache_reads_no_uninitialised_memory(monkeypatch):
    """Padded rows attend over every slot, masked: a masked NaN would still poison the sum (0 · NaN). New
    capacity must be written before it is read: ``new_empty`` / ``torch.empty`` are poisoned with NaN here."""
    real_new_empty, real_empty = torch.Tensor.new_empty, torch.empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: real_new_empty(self, *a, **k).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    layer = layer_of(CASES["global"], seed=8)
    lengths = [1, 5]
    xs = inputs(lengths, 12, seed=9)
    with torch.no_grad():
        state, offset = ragged_state(layer, xs, lengths)
        outs = []
        for t in range(12):  # the capacity grows several times
            y, state = layer.step(torch.stack([x[n + t] for x, n in zip(xs, lengths)]), state, offset + t)
            outs.append(y)
    got = torch.stack(outs, dim=1)
    assert torch.isfinite(got).all()
    for b, (x, n) in enumerate(zip(xs, lengths)):
        want, _ = layer(x[None])
        assert (got[b] - want[0, n:]).abs().max().item() <= 1e-12 * want.abs().max().item()


def test_per_row_positions_are_checked():
    layer = layer_of(CASES["window-3"])
    x = torch.randn(2, 1, D_MODEL, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^offset: expected an int or an int64 tensor \(B,\) = \(2,\) of per-row "
                                         r"positions, got a tensor of shape \(3,\) \(int64\)$"):
        layer(x, offset=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"^offset: expected positions >= 0, got \[0, -1\]$"):
        layer(x, offset=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match=r"^offset: expected 0 or a list of N=1 positions with cu_seqlens, got a tensor$"):
        layer(x[:1], offset=torch.tensor([0]), cu_seqlens=torch.tensor([0, 1]))
