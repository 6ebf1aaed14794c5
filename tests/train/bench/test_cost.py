"""hybrid.train.bench.cost on tiny models: training memory and the decoding state."""
from __future__ import annotations

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench.cost import decode_cost, training_memory

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)

VOCAB = 264


def model_of(**overrides) -> HybridLM:
    torch.manual_seed(0)
    # init_std 0.5: logits far from uniform, so that every position and mixer shows in the losses
    fields = dict(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=2, pattern="RA", window=4, init_std=0.5)
    config = HybridConfig(**{**fields, **overrides})
    return HybridLM(config).eval()


def test_training_memory_counts_weights_grads_moments_and_saved_activations():
    model = model_of()
    weights = sum(p.numel() * 4 for p in model.parameters())
    short = training_memory(model, batch_size=2, seq_len=5)["train_memory_bytes"]
    long = training_memory(model, batch_size=2, seq_len=10)["train_memory_bytes"]
    assert short > 4 * weights  # activations on top of weights, grads and two AdamW moments
    assert long - 4 * weights > 1.5 * (short - 4 * weights)  # activations grow with the length
    assert all(p.grad is None for p in model.parameters())


def test_decode_state_bytes_are_the_cache_and_the_recurrent_state():
    config = HybridConfig(vocab_size=VOCAB, d_model=12, n_heads=2, n_layers=2, pattern="A", rope_placement="qk")
    model = HybridLM(config).eval()
    for context in (7, 13):
        cost = decode_cost(model, context=context, new_tokens=2)
        # a global attention cache: keys and values, per layer, per held token, float32
        assert cost["state_bytes"] == 2 * 2 * context * 12 * 4
        assert cost["ms_per_token"] > 0 and cost["context"] == context
    windowed = HybridLM(config.replace(pattern="RA", window=4)).eval()
    assert decode_cost(windowed, context=7, new_tokens=1)["state_bytes"] == \
        decode_cost(windowed, context=13, new_tokens=1)["state_bytes"]
