"""HybridState (models/state.py): typed per-layer states and the position kept once; clone() for branching, cat()
for batching per-sequence states, nbytes."""
from __future__ import annotations

import typing

import pytest
import torch

from hybrid import AttentionState, MixerState, RecurrenceState, RetentionState
from hybrid.models import HybridConfig, HybridLM, HybridState

VOCAB = 37


def test_model_state_is_typed_and_built_alike():
    hints = typing.get_type_hints(HybridState)
    assert typing.get_args(hints["layers"]) == (MixerState,)
    config = HybridConfig(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=3, pattern="RAM")
    state = HybridLM(config).init_state(2, dtype=torch.float64)
    assert [type(s) for s in state.layers] == [RecurrenceState, AttentionState, RetentionState]
    assert all(isinstance(s, MixerState) for s in state.layers)
    assert state.layers[0].conv.dtype == torch.float64 and state.offset == 0
    clone = state.clone()
    assert clone.layers[0] is state.layers[0] and clone.layers[2] is state.layers[2]  # never written in place
    assert clone.layers[1] is not state.layers[1]


def test_nbytes_sums_the_layers_and_clone_keeps_the_offset():
    config = HybridConfig(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=3, pattern="RAM")
    model = HybridLM(config)
    with torch.no_grad():
        _, state = model(torch.randint(0, VOCAB, (2, 5)))
    assert state.offset == 5 and state.nbytes == sum(layer.nbytes for layer in state.layers) > 0
    clone = state.clone()
    assert clone.offset == 5 and clone.nbytes == state.nbytes
    assert HybridState().nbytes == 0 and HybridState().offset == 0


def test_branching_from_a_prompt_needs_clone_with_a_window():
    """Decoding writes the window ring in place: branching takes a clone; each branch equals a fresh run."""
    config = HybridConfig.preset("hybrid", "tiny", d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB, window=4)
    torch.manual_seed(0)
    model = HybridLM(config).eval()
    prompt = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    a, b = torch.tensor([3]), torch.tensor([11])
    with torch.no_grad():
        _, state = model(prompt)
        spare = state.clone()
        logits_a, _ = model.step(a, state)
        with pytest.raises(ValueError, match=r"clone\(\)"):
            model.step(b, state)
        logits_b, _ = model.step(b, spare)
        ref_a, _ = model(torch.cat([prompt, a[:, None]], 1))
        ref_b, _ = model(torch.cat([prompt, b[:, None]], 1))
    for got, ref in ((logits_a, ref_a[:, -1]), (logits_b, ref_b[:, -1])):  # float32: relative to the logit scale
        assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert spare.nbytes == state.nbytes


@pytest.fixture
def windowed_hybrid(float64_model_of) -> HybridLM:
    """A float64 hybrid (window 4) with non-trivial gains and biases and sharp attention."""
    config = HybridConfig.preset("hybrid", "tiny", d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB, window=4)
    return float64_model_of(config)


def test_states_cat_into_one_batch(windowed_hybrid):
    """``HybridState.cat`` of per-sequence states of equal length continues like a batched run."""
    model = windowed_hybrid
    ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(5))
    more = torch.randint(0, VOCAB, (3, 4), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        _, states = model(ids.reshape(1, -1), cu_seqlens=torch.tensor([0, 7, 14, 21]))
        batched = HybridState.cat(states)
        got, _ = model(more, state=batched)
        want, _ = model(torch.cat([ids, more], dim=1))
    scale = want[:, 7:].abs().max().item()
    err = (got - want[:, 7:]).abs().max().item()
    assert err <= 1e-9 * scale, f"continuation from concatenated states: max error {err:.3g}, scale {scale:.3g}"


def test_cat_joins_states_at_any_offsets(windowed_hybrid):
    """States at different positions join as a ragged batch (per-row positions); an empty list is refused."""
    model = windowed_hybrid
    with torch.no_grad():
        _, states = model(torch.zeros(1, 5, dtype=torch.long), cu_seqlens=torch.tensor([0, 2, 5]))
    assert [s.offset for s in states] == [2, 3]
    joined = HybridState.cat(states)
    assert joined.ragged and joined.offset.tolist() == [2, 3] and joined.batch_size == 2
    with pytest.raises(ValueError, match=r"^states: expected a non-empty list of HybridStates, got an empty list$"):
        HybridState.cat([])


def test_a_layer_state_without_the_row_operations_is_named(windowed_hybrid):
    """A mixer state that does not follow the decode-state API (hybrid.mixer) fails in one line that says how."""
    from dataclasses import dataclass

    @dataclass
    class BareState:
        s: torch.Tensor

    state = HybridState(layers=[BareState(torch.zeros(2, 3))], offset=torch.tensor([1, 4]))
    with pytest.raises(ValueError, match=r"^state: expected layer states with select\(\) \(hybrid.mixer's "
                                         r"decode-state API: inherit hybrid.batch_state.TensorState .*got a BareState"):
        state.select(torch.tensor([0]))
    with pytest.raises(ValueError, match=r"with cat\(\)"):
        HybridState.cat([state, state])
