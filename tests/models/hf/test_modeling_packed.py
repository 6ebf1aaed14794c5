"""HybridForCausalLM on padding-free rows (DataCollatorWithFlattening) and padded batches as one packed forward."""
import random

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import DataCollatorWithFlattening  # noqa: E402

from hybrid.models import HybridConfig  # noqa: E402
from hybrid.models.hf.compat import OUTPUT_CACHE_FIELD  # noqa: E402

V = 41
TINY = dict(d_model=24, n_layers=3, n_heads=2, vocab_size=V)
CASES = {
    "hybrid": HybridConfig.preset("hybrid", **TINY, window=3),
    "transformer": HybridConfig.preset("transformer", **TINY),
    "retnet": HybridConfig.preset("retnet", **TINY),
    "vo-rnn": HybridConfig.preset("vo-rnn", **TINY, rnn_selective=True),
}


@pytest.fixture
def make_float64(hf_model):
    """``make_float64(name, seed=0)``: the seeded model of ``CASES[name]`` (conftest.py's hf_model) in float64."""
    return lambda name, seed=0: hf_model(CASES[name], seed).double()


def docs_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (n,), generator=g) for n in lengths]


def assert_close(actual, expected, what, rel=1e-10):
    err = (actual - expected).abs().max().item()
    assert err <= rel * expected.abs().max().item(), f"{what}: max error {err:.3g}"


@pytest.mark.parametrize("name", list(CASES))
def test_padding_free_row_equals_each_document_alone(name, make_float64):
    model = make_float64(name)
    docs = docs_of([5, 1, 9, 2, 7])
    batch = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": d.tolist()} for d in docs])
    assert batch["input_ids"].shape[0] == 1 and "position_ids" in batch
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"])
        alone = [model(input_ids=d[None], labels=d[None]) for d in docs]
    assert getattr(out, OUTPUT_CACHE_FIELD) is None
    assert_close(out.logits[0], torch.cat([a.logits[0] for a in alone]), "padding-free logits")
    # the collator masks each document's first label: the loss is the mean over every document's own targets
    targets = sum(len(d) - 1 for d in docs)
    expected = sum(a.loss * (len(d) - 1) for a, d in zip(alone, docs) if len(d) > 1) / targets
    assert_close(out.loss, expected, "padding-free loss", rel=1e-6)  # the loss is taken in float32


@pytest.mark.parametrize("name", list(CASES))
def test_padded_batch_is_one_packed_forward(name, monkeypatch, make_float64):
    model = make_float64(name, seed=1)
    rng = random.Random(0)
    lengths = [rng.randint(1, 12) for _ in range(16)]
    T = max(lengths)
    ids = torch.randint(1, V, (16, T), generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(16, T, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, T - n:] = 1  # left padding
    calls = []
    inner = model.model.forward
    monkeypatch.setattr(model.model, "forward", lambda *a, **k: calls.append(1) or inner(*a, **k))
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True)
    assert len(calls) == 1, f"{len(calls)} forwards for one padded batch"
    monkeypatch.setattr(model.model, "forward", inner)
    with torch.no_grad():
        for i, n in enumerate(lengths):
            alone = model(ids[i:i + 1, T - n:], use_cache=False).logits[0]
            assert_close(out.logits[i, T - n:], alone, f"row {i}")
            assert bool((out.logits[i, :T - n] == 0).all())
        # the cache continues every row as its own run does
        nxt = torch.randint(1, V, (16, 1), generator=torch.Generator().manual_seed(3))
        step = model(nxt, attention_mask=torch.cat([mask, torch.ones(16, 1, dtype=torch.long)], 1),
                     past_key_values=getattr(out, OUTPUT_CACHE_FIELD))
        for i, n in enumerate(lengths):
            alone = model(torch.cat([ids[i:i + 1, T - n:], nxt[i:i + 1]], 1), use_cache=False).logits[0, -1]
            assert_close(step.logits[i, -1], alone, f"row {i}, next token")


@pytest.mark.parametrize("name", ["hybrid", "transformer"])
def test_generate_tokens_unchanged_with_left_padding_and_beams(name, make_float64):
    model = make_float64(name, seed=2).float()
    prompts = docs_of([3, 8, 5], seed=4)
    T = max(len(p) for p in prompts)
    ids = torch.zeros(3, T, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):] = p
        mask[i, T - len(p):] = 1
    for beams in (1, 2):
        kw = dict(max_new_tokens=6, do_sample=False, num_beams=beams, pad_token_id=0)
        batched = model.generate(ids, attention_mask=mask, **kw)
        for i, p in enumerate(prompts):
            alone = model.generate(p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long), **kw)
            assert batched[i, T:].tolist() == alone[0, len(p):].tolist(), f"row {i}, beams {beams}"


@pytest.mark.parametrize("positions,message", [
    (torch.tensor([[1, 2, 3, 4]]), "position_ids: expected positions that start at 0"),
    (torch.tensor([[0, 1, 3, 4]]), "position_ids: expected positions that start at 0"),
    (torch.tensor([[0, 1, 0, 1], [0, 1, 0, 1]]), "position_ids: expected 0 … T−1 in every row"),
    (torch.tensor([[0, 1, 2]]), "position_ids: expected shape"),
])
def test_bad_position_ids_are_one_line(positions, message, make_float64):
    model = make_float64("hybrid")
    ids = torch.randint(1, V, (positions.shape[0], 4))
    with pytest.raises(ValueError) as info:
        model(input_ids=ids, position_ids=positions)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_position_ids_of_plain_rows_change_nothing(make_float64):
    model = make_float64("transformer")
    ids = torch.randint(1, V, (2, 6))
    with torch.no_grad():
        plain = model(ids).logits
        given = model(ids, position_ids=torch.arange(6).expand(2, 6)).logits
    assert torch.equal(plain, given)


@pytest.mark.parametrize("name", ["hybrid", "transformer"])
def test_a_padded_batch_decodes_as_one_batch_per_token(name, monkeypatch, make_float64):
    """After the packed prefill, every new token is one forward for the whole batch (rows at their own positions),
    whatever the rows' prompt lengths; tokens unchanged from each row alone."""
    model = make_float64(name, seed=3).float()
    prompts = docs_of([2, 9, 5, 1], seed=6)
    T = max(len(p) for p in prompts)
    ids = torch.zeros(4, T, dtype=torch.long)
    mask = torch.zeros(4, T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):], mask[i, T - len(p):] = p, 1
    batches = []
    inner = model.model.forward
    monkeypatch.setattr(model.model, "forward", lambda ids, *a, **k: batches.append(tuple(ids.shape)) or inner(ids, *a, **k))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert batches[0] == (1, sum(len(p) for p in prompts)) and batches[1:] == [(4, 1)] * 5
    monkeypatch.setattr(model.model, "forward", inner)
    for i, p in enumerate(prompts):
        alone = model.generate(p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=6,
                               do_sample=False, pad_token_id=0)
        assert out[i, T:].tolist() == alone[0, len(p):].tolist(), f"row {i}"
