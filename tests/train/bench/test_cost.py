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


@pytest.mark.parametrize("pattern", ["A", "RA"])
def test_training_memory_counts_the_weights_four_times_not_five(pattern):
    """Autograd saves a Linear's weight for the backward pass: that storage is the parameter's own, already in
    4 × weights, not new memory. Checked against a count of this test's own: every distinct storage autograd saves
    in the same step, less the parameters' storages (which the figure once counted a fifth time)."""
    model = model_of(pattern=pattern)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, VOCAB, (2, 7))
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits, _ = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)
    activations = sum(n for ptr, n in saved.items() if ptr not in params)
    weights_saved = sum(n for ptr, n in saved.items() if ptr in params)
    assert weights_saved > 0  # the case: weights among the saved storages
    got = training_memory(model, batch_size=2, seq_len=6)["train_memory_bytes"]
    assert got == 4 * weights + activations


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


def test_decode_compare_measures_every_run_in_turn(train_run, capsys, one_line_error):
    from hybrid.train.bench.decode_compare import compare_decoding, table_rows
    from hybrid.train.cli.studies.decode_compare import main

    tiny = ["--d-model", "16", "--n-layers", "2", "--n-heads", "2", "--seq-len", "16", "--batch-size", "2"]
    window = train_run("window", 1, ["--preset", "transformer", "--window", "8", *tiny])
    hybrid = train_run("hybrid", 1, ["--preset", "hybrid", "--pattern", "RA", "--window", "8", *tiny])
    assert main([str(window), str(hybrid), "--context", "40", "--tokens", "2", "--repeats", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "decoding after 40 tokens, 2 tokens per measurement, 2 repeats in turn" in out
    rows = [line for line in out.splitlines() if line.startswith(f"| {window}") or line.startswith(f"| {hybrid}")]
    assert len(rows) == 2 and rows[0].split("|")[4].strip() == "1.00"  # the first run is the ratio's base
    models = {"a": model_of(), "b": model_of(pattern="AA")}
    results = compare_decoding(models, context=12, tokens=1, repeats=3)
    assert [len(r["ms_per_token"]) for r in results.values()] == [3, 3]
    assert results["a"]["state_bytes"] == decode_cost(models["a"], context=12, new_tokens=1)["state_bytes"]
    results["a"]["ms_per_token"], results["b"]["ms_per_token"] = [2.0, 1.0, 4.0], [3.0, 6.0, 9.0]
    assert table_rows(results)[1][1:4] == ["6.00", "3.00–9.00", "3.00"]
    assert main([str(window), str(window)]) == 2
    one_line_error(capsys, "python -m hybrid.train.cli.studies.decode_compare", "runs: expected distinct run directories")
