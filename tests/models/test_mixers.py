"""The mixer contract as code: one table from letter to mixer, one init_state signature, typed and cloneable
model states."""
from __future__ import annotations

import inspect
import typing

import pytest
import torch

from hybrid import Attention, AttentionState, MultiScaleRetention, RecurrenceState, RetentionState, VORecurrence
from hybrid.models import HybridConfig, HybridLM, HybridState
from hybrid.models.config import MIXER_LETTERS
from hybrid.models.mixers import MIXERS, build_mixer

VOCAB = 37


def test_one_row_per_letter_builds_its_class():
    config = HybridConfig(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=3, pattern="RAM", window=4,
                          rope_placement="qkvo", n_kv_heads=1)
    assert set(MIXERS) == set(MIXER_LETTERS)
    expected = {"R": VORecurrence, "A": Attention, "M": MultiScaleRetention}
    for letter, cls in expected.items():
        mixer = build_mixer(config, letter)
        assert type(mixer) is cls and MIXERS[letter].cls is cls
    attn = build_mixer(config, "A")
    assert (attn.window, attn.n_kv_heads, attn.placement.name) == (4, 1, "qkvo")  # the config reaches the mixer
    with pytest.raises(ValueError, match=r"pattern: expected a mixer letter from \['A', 'M', 'R'\], got 'X'"):
        build_mixer(config, "X")


@pytest.mark.parametrize("cls", [VORecurrence, Attention, MultiScaleRetention])
def test_init_state_signature_is_common(cls):
    params = list(inspect.signature(cls.init_state).parameters.values())
    assert [(p.name, p.default) for p in params] == [
        ("self", inspect.Parameter.empty), ("batch_size", inspect.Parameter.empty), ("device", None), ("dtype", None)]


def test_model_state_is_typed_and_built_alike():
    hints = typing.get_type_hints(HybridState)
    assert typing.get_args(hints["layers"]) and set(typing.get_args(typing.get_args(hints["layers"])[0])) == {
        RecurrenceState, AttentionState, RetentionState}
    config = HybridConfig(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=3, pattern="RAM")
    state = HybridLM(config).init_state(2, dtype=torch.float64)
    assert [type(s) for s in state.layers] == [RecurrenceState, AttentionState, RetentionState]
    assert state.layers[0].conv.dtype == torch.float64 and state.offset == 0


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
